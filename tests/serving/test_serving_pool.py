"""Two real embedded engines behind one real gateway (uvicorn in this process, spans to the
session broker): rollouts stick to an engine and new ones spread over both; each span carries
the version of the engine that answered; an engine killed mid-traffic costs no call and comes
back when restarted; and one reloader brings both engines to a newly registered version while
agents call throughout, none failing."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import defaultdict

import httpx
import pytest

from infra import processes
from serving.reloader import Reloader
from testkit.fixed_upstream import ServerThread
from testkit.metrics import get_state, metric_samples
from testkit.producers import consume
from testkit.serving import EnginePool, load_adapter, make_adapters, policy_info, register_version
from tracetrain.settings.infra import MlflowSettings
from tracetrain.settings.serving import ReloaderSettings

QUESTION = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def engine_pool(tmp_path_factory, base_model_dir):
    """Two engines, kept light: two slots of 512 tokens and one thread each."""
    pool = EnginePool(tmp_path_factory.mktemp("pool-home"), base_model_dir, size=2, slots=2,
                      max_context=512, threads=1)
    for index in range(2):
        pool.start(index)
    yield pool
    for index in range(2):
        pool.stop(index)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, base_model_dir):
    return make_adapters(base_model_dir, tmp_path_factory.mktemp("pool-adapters"), seeds=[21, 22])


@pytest.fixture
def gateway(kafka_settings, engine_pool, tmp_path):
    """(url, settings, publisher) of a gateway in front of both engines, probing them every
    0.2 s."""
    from producers.gateway.app import create_app
    from producers.publisher import Publisher

    gw = kafka_settings.gateway.model_copy(update={
        "upstream_urls": [f"{url}/v1" for url in engine_pool.urls], "versions_refresh_s": 0.2,
        "probe_timeout_s": 2.0})
    settings = kafka_settings.model_copy(update={"gateway": gw})
    pub = Publisher(settings, name="gw-pool", spool_dir=tmp_path / "spool")
    server = ServerThread(create_app(settings, publisher=pub), processes.free_port()).start()
    yield server.url, settings, pub
    server.stop()
    pub.close(10)


class Agents:
    """Client threads calling the gateway until stopped, each rollout `turns` calls long (a
    fresh rollout id per rollout); every answer's span id and X-Policy-Version are kept, and
    every failure."""

    def __init__(self, url: str, threads: int = 4, turns: int = 2, stream_every: int = 0):
        self.url, self.turns, self.stream_every = url, turns, stream_every
        self.answers: dict[str, int] = {}  # span id -> the X-Policy-Version the agent got
        self.failures: list[str] = []
        self.calls = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Agents:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                rollout = f"ro-{uuid.uuid4().hex[:10]}"
                for _ in range(self.turns):
                    self.calls += 1
                    stream = bool(self.stream_every) and self.calls % self.stream_every == 0
                    self._call(client, rollout, stream)

    def _call(self, client: httpx.Client, rollout: str, stream: bool) -> None:
        body = {"model": "policy", "messages": QUESTION, "max_tokens": 6, "stream": stream}
        try:
            with client.stream("POST", f"{self.url}/v1/chat/completions", json=body,
                               headers={"X-Rollout-Id": rollout}) as resp:
                text = resp.read().decode()
                if resp.status_code != 200 or (stream and "data: [DONE]" not in text):
                    self.failures.append(f"{resp.status_code}: {text[:300]}")
                    return
                self.answers[resp.headers["x-span-id"]] = _version(resp, text)
        except httpx.HTTPError as exc:
            self.failures.append(repr(exc))


def _version(resp: httpx.Response, text: str) -> int:
    """The policy version an answer says: its header, or a stream's chunks (the embedded
    engine knows which of its servers answers only once the stream has begun)."""
    if "x-policy-version" in resp.headers:
        return int(resp.headers["x-policy-version"])
    chunks = [json.loads(line[len("data: "):]) for line in text.splitlines()
              if line.startswith("data: {")]
    [version] = {chunk["policy_version"] for chunk in chunks}
    return version


def _spans(settings, pub, expected: int) -> list[dict]:
    assert pub.flush(30) == 0
    return [span for _key, span in consume(settings.kafka.bootstrap_servers,
                                           settings.topics.spans, expected, settle_s=0.5)]


def _wait(check, timeout_s: float, what: str) -> None:
    processes.wait_until(check, timeout_s, what)


def _ask(url: str, rollout: str) -> httpx.Response:
    response = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                          headers={"X-Rollout-Id": rollout},
                          json={"model": "policy", "messages": QUESTION, "max_tokens": 4})
    assert response.status_code == 200, response.text
    return response


def test_rollouts_stick_to_one_engine_and_new_ones_spread_over_both(gateway, engine_pool):
    url, settings, pub = gateway
    sent_before = [policy_info(u)["requests"] for u in engine_pool.urls]
    with Agents(url, threads=4, turns=3) as agents:
        _wait(lambda: len(agents.answers) >= 24, 120, "24 answers")
    assert agents.failures == []
    spans = _spans(settings, pub, len(agents.answers))
    engines_of: dict[str, set[str]] = defaultdict(set)
    for span in spans:
        assert span["status"] == "ok", span["error_message"]
        engines_of[span["rollout_id"]].add(span["attributes"]["gateway.upstream"])
    assert all(len(engines) == 1 for engines in engines_of.values()), engines_of
    per_engine = defaultdict(int)
    for (engine,) in engines_of.values():
        per_engine[engine] += 1
    assert set(per_engine) == {f"{u}/v1" for u in engine_pool.urls}, per_engine
    assert [policy_info(u)["requests"] > before
            for u, before in zip(engine_pool.urls, sent_before, strict=True)] == [True, True]
    pool = get_state(url)["pool"]
    assert pool["healthy"] == 2 and [e["in_flight"] for e in pool["engines"]] == [0, 0]
    samples = metric_samples(httpx.get(f"{url}/metrics").text)
    for engine in engine_pool.urls:
        labels = {"upstream": f"{engine}/v1"}
        assert samples["tracetrain_gateway_upstream_sent_calls_total", labels] > 0
        assert samples["tracetrain_gateway_upstream_healthy_value", labels] == 1


def test_each_span_carries_the_version_of_the_engine_that_answered(gateway, engine_pool,
                                                                   adapters):
    """The engines serve different versions: every span says the version of the one that
    answered it."""
    url, settings, pub = gateway
    first, second = engine_pool.urls
    other = max(policy_info(u)["policy_version"] for u in engine_pool.urls) + 10
    load = load_adapter(engine_pool.settings[1], adapters[0], policy_version=other)
    assert load.status_code == 200, load.text
    serving = {f"{first}/v1": policy_info(first)["policy_version"], f"{second}/v1": other}
    assert len(set(serving.values())) == 2
    with Agents(url, threads=4, turns=1) as agents:
        _wait(lambda: len(agents.answers) >= 16, 120, "16 answers")
    assert agents.failures == []
    spans = _spans(settings, pub, len(agents.answers))
    seen = {span["attributes"]["gateway.upstream"] for span in spans}
    assert seen == set(serving)
    for span in spans:
        assert span["llm"]["policy_version"] == serving[span["attributes"]["gateway.upstream"]]
        assert span["llm"]["policy_version"] == agents.answers[span["span_id"]]


@pytest.mark.faults
def test_a_killed_engine_costs_no_call_and_is_taken_back_once_restarted(gateway, engine_pool):
    """Calls in flight on the killed engine had no byte of their answer yet: each is sent
    again to the other engine, so no agent sees a failure (the agents' calls are not streamed:
    a stream cut after its first bytes cannot be sent again)."""
    url, settings, pub = gateway
    first, second = (f"{u}/v1" for u in engine_pool.urls)
    for rollout in ("ro-a", "ro-b"):  # an idle pool takes turns: one rollout on each engine
        _ask(url, rollout)
    with Agents(url, threads=4, turns=2) as agents:
        _wait(lambda: len(agents.answers) >= 8, 60, "8 answers before the kill")
        _wait(lambda: get_state(url)["pool"]["engines"][1]["in_flight"] > 0, 10,
              "a call in flight on the engine to kill")
        engine_pool.kill(1)
        killed_at = time.time_ns()
        _wait(lambda: not get_state(url)["pool"]["engines"][1]["healthy"], 10,
              "the gateway to take the dead engine out")
        answered = len(agents.answers)
        _wait(lambda: len(agents.answers) >= answered + 12, 120, "12 answers after the kill")
        for rollout in ("ro-a", "ro-b"):  # the one whose engine died moves to the other
            _ask(url, rollout)
        streamed = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": "policy", "messages": QUESTION, "max_tokens": 4, "stream": True})
        assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
        restarted_at = time.time_ns()
        engine_pool.start(1)
        _wait(lambda: get_state(url)["pool"]["engines"][1]["healthy"], 10,
              "the gateway to take the restarted engine back")
        back_at = time.time_ns()
        sent = get_state(url)["pool"]["engines"][1]["sent"]
        _wait(lambda: get_state(url)["pool"]["engines"][1]["sent"] > sent + 2, 60,
              "new rollouts on the restarted engine")
    assert agents.failures == []
    dead = get_state(url)["pool"]["engines"][1]
    assert dead["healthy"] and dead["outages"] == 1 and dead["last_error"]
    assert dead["retried"] >= 1, "no call was caught in flight by the kill: nothing was retried"
    spans = _spans(settings, pub, len(agents.answers) + 5)
    assert all(s["status"] == "ok" for s in spans), [s["error_message"] for s in spans
                                                     if s["status"] != "ok"]
    out = [s for s in spans if killed_at < s["start_time_ns"] < restarted_at]
    assert out and {s["attributes"]["gateway.upstream"] for s in out} == {first}
    assert any(s["attributes"]["gateway.upstream"] == second and s["start_time_ns"] > back_at
               for s in spans)
    path = {rollout: [s["attributes"]["gateway.upstream"] for s in
                      sorted(spans, key=lambda s: s["start_time_ns"]) if s["rollout_id"] == rollout]
            for rollout in ("ro-a", "ro-b")}
    assert path == {"ro-a": [first, first], "ro-b": [second, first]}


@pytest.mark.faults
def test_one_reloader_brings_both_engines_to_a_new_version_while_agents_call(
        gateway, engine_pool, adapters, mlflow_server):
    url, settings, pub = gateway
    name = f"pool-{uuid.uuid4().hex[:6]}"
    reloader_settings = engine_pool.settings[0].model_copy(update={
        "mlflow": MlflowSettings(port=mlflow_server.port, registered_model=name),
        "reloader": ReloaderSettings(alias="production", poll_s=0.2,
                                     engine_urls=engine_pool.urls)})
    before = {f"{u}/v1": policy_info(u)["policy_version"] for u in engine_pool.urls}
    reloader = Reloader(reloader_settings)
    with Agents(url, threads=4, turns=2, stream_every=3) as agents:
        _wait(lambda: len(agents.answers) >= 8, 60, "8 answers before the new version")
        version = register_version(mlflow_server.uri, name, adapters[1])
        state = reloader.run(max_seconds=120, max_loads=1)
        answered = len(agents.answers)
        _wait(lambda: len(agents.answers) >= answered + 8, 60, "8 answers after it")
    assert agents.failures == []
    assert state.converged and state.serving_version == version
    assert {u: e["serving_version"] for u, e in state.engines.items()} == \
        {u: version for u in engine_pool.urls}
    assert [policy_info(u)["policy_version"] for u in engine_pool.urls] == [version, version]
    loaded_at = {f"{load['engine']}/v1": load["at"] for load in state.loads}
    spans = _spans(settings, pub, len(agents.answers))
    for span in spans:
        engine = span["attributes"]["gateway.upstream"]
        got = span["llm"]["policy_version"]
        assert span["status"] == "ok", span["error_message"]
        assert got == agents.answers[span["span_id"]]  # what the agent was told
        assert got in (before[engine], version)
        if span["start_time_ns"] / 1e9 > loaded_at[engine]:
            assert got == version, "a call sent after its engine swapped got the old version"
    for engine in before:
        assert version in {s["llm"]["policy_version"] for s in spans
                           if s["attributes"]["gateway.upstream"] == engine}
