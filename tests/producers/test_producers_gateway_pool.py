"""The gateway's engine pool without processes: which engine a call goes to (rollouts stick,
new ones go to the least loaded, in turn on ties), how an engine goes out and comes back, and
the one retry of `upstreams.send` on another engine (fake attempts, no HTTP server)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from producers.errors import NoHealthyEngine
from producers.gateway import upstreams
from producers.gateway.pool import Lease, Pool
from tracetrain.errors import ConfigError
from tracetrain.settings import load_settings
from tracetrain.settings.producers import GatewaySettings

A, B, C = "http://a:8100/v1", "http://b:8100/v1", "http://c:8100/v1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pool(*urls: str, ttl: float = 60.0, most: int = 100, clock=None) -> Pool:
    return Pool(list(urls or (A, B)), ttl, most, clock=clock or Clock())


def test_a_rollout_sticks_to_its_engine_even_when_another_is_less_loaded():
    p = pool()
    first = p.pick("ro-1")
    held = [Lease(first) for _ in range(5)]  # its engine is now the busier one
    assert all(p.pick("ro-1") is first for _ in range(10))
    other = p.pick("ro-2")
    assert other is not first
    for lease in held:
        lease.release()
    assert first.in_flight == 0 and first.sent == 5


def test_new_rollouts_go_to_the_least_loaded_engine_and_take_turns_on_ties():
    p = pool(A, B, C)
    assert [p.pick(f"ro-{i}").url for i in range(6)] == [A, B, C, A, B, C]
    a, b, c = p.engines
    busy = [Lease(a), Lease(a), Lease(b)]
    assert p.pick("ro-new") is c
    assert p.pick("ro-newer") is c  # c still has none in flight
    Lease(c), Lease(c)
    assert p.pick("ro-newest") is b  # b 1, a 2, c 2
    for lease in busy:
        lease.release()


def test_a_lease_is_given_back_once():
    p = pool()
    engine = p.pick(None)
    lease = Lease(engine)
    lease.release()
    lease.release()
    assert engine.in_flight == 0


def test_a_failed_engine_is_out_its_rollouts_move_and_stay_after_it_returns():
    p = pool()
    a, b = p.engines
    assert p.pick("ro-1") is a
    assert p.failed(a, "ConnectError") is True
    assert p.failed(a, "ConnectError") is False  # already out: one outage
    assert (a.healthy, a.failures, a.outages) == (False, 2, 1)
    assert all(p.pick(f"ro-new-{i}") is b for i in range(3))
    assert p.pick("ro-1") is b
    assert p.answered(a) is True and p.answered(a) is False
    assert a.healthy and a.down_since is None
    assert p.pick("ro-1") is b  # moving back would cost it a second cold cache
    assert p.pick("ro-after") is a  # a has none in flight and it is its turn


def test_with_every_engine_out_nothing_is_picked_and_the_reason_names_each():
    clock = Clock()
    p = pool(clock=clock)
    a, b = p.engines
    p.failed(a, "ConnectError('refused')")
    clock.now += 2.5
    p.failed(b, "answered a call with 503")
    clock.now += 1.0
    assert p.pick("ro-1") is None and p.pick(None) is None
    text = p.unavailable()
    assert f"{A} (out for 3.5s: ConnectError('refused'))" in text
    assert f"{B} (out for 1.0s: answered a call with 503)" in text
    assert p.state()["healthy"] == 0


def test_an_idle_rollout_is_forgotten_after_the_ttl_and_the_oldest_beyond_the_bound():
    clock = Clock()
    p = pool(ttl=10.0, most=3, clock=clock)
    a, b = p.engines
    assert p.pick("ro-idle") is a
    clock.now += 11.0
    Lease(b)  # b is busier now: a forgotten rollout goes by load, like a new one
    assert p.pick("ro-idle") is a and p.engine_of("ro-idle") is a
    Lease(a), Lease(a)
    clock.now += 11.0
    assert p.pick("ro-idle") is b  # forgotten again, and a is the busier now
    for i in range(3):
        p.pick(f"ro-{i}")
    assert p.engine_of("ro-idle") is None  # the longest idle went first
    assert p.state()["rollouts_remembered"] == 3


def test_a_rollout_within_the_ttl_is_kept_and_each_call_renews_it():
    clock = Clock()
    p = pool(ttl=10.0, clock=clock)
    engine = p.pick("ro-1")
    for _ in range(5):
        clock.now += 9.0
        assert p.pick("ro-1") is engine
        Lease(engine)  # busier every time: only stickiness keeps it there


def test_the_newest_versioned_name_of_the_pool():
    p = pool()
    a, b = p.engines
    a.versions.update(["policy", "policy-v3", "policy-v4"])
    b.versions.update(["policy", "policy-v5"])
    assert p.newest_versions() == {"policy": "policy-v5"}
    assert a.versions.pick("policy") == "policy-v4"  # each engine's calls get its own


# ---- upstreams.send: one retry on another engine --------------------------------------------
def _run(p: Pool, answers: dict, rollout: str | None = "ro-1"):
    """send() with an attempt that answers from `answers[url]`: an exception to raise or an
    HTTP status; the urls tried, in order, and the outcome."""
    tried = []

    async def attempt(engine):
        tried.append(engine.url)
        answer = answers[engine.url]
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer, json={"from": engine.url})

    try:
        outcome = asyncio.run(upstreams.send(p, rollout, attempt, retry_after_s=1.0))
    except (upstreams.Unreachable, NoHealthyEngine) as exc:
        outcome = exc
    return tried, outcome


def test_a_call_whose_engine_fails_before_answering_is_sent_once_to_another():
    p = pool()
    tried, sent = _run(p, {A: httpx.ConnectError("refused"), B: 200})
    assert tried == [A, B] and sent.engine.url == B and sent.response.status_code == 200
    a, b = p.engines
    assert not a.healthy and a.retried == 1 and a.in_flight == 0
    assert b.in_flight == 1  # the caller's until the answer is relayed
    sent.lease.release()
    assert p.engine_of("ro-1") is b


def test_a_5xx_is_retried_on_another_engine_and_passed_through_when_there_is_none():
    p = pool()
    tried, sent = _run(p, {A: 503, B: 200})
    assert tried == [A, B] and sent.response.status_code == 200
    p = pool(A)
    tried, sent = _run(p, {A: 503})
    assert tried == [A] and sent.response.status_code == 503  # the agent gets it as it was
    assert not p.engines[0].healthy


def test_only_one_retry_and_the_error_names_both_engines():
    p = pool(A, B, C)
    tried, exc = _run(p, {A: httpx.ConnectError("refused"), B: httpx.ReadTimeout("slow"),
                          C: 200})
    assert tried == [A, B] and isinstance(exc, upstreams.Unreachable)
    assert A in str(exc) and B in str(exc) and "ReadTimeout" in str(exc)
    assert exc.engine.url == B and p.engines[2].healthy


def test_with_every_engine_out_a_call_is_not_sent():
    p = pool()
    for engine in p.engines:
        p.failed(engine, "probe of /models failed")
    tried, exc = _run(p, {})
    assert tried == [] and isinstance(exc, NoHealthyEngine) and exc.retry_after == 1.0
    assert "no healthy engine" in str(exc) and A in str(exc) and B in str(exc)


def test_the_gateways_own_connection_limit_does_not_take_an_engine_out():
    p = pool(A)
    tried, exc = _run(p, {A: httpx.PoolTimeout("all connections busy")})
    assert isinstance(exc, upstreams.Unreachable) and p.engines[0].healthy


def test_a_probe_takes_an_engine_out_and_back_and_reads_its_versioned_names():
    p = pool(A)
    engine = p.engines[0]
    answers = iter([httpx.ConnectError("refused"), httpx.Response(500),
                    httpx.Response(200, json={"data": [{"id": "policy"},
                                                       {"id": "policy-v2"}]})])

    def handler(request):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def probes():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            seen = []
            for _ in range(3):
                await upstreams.probe(p, engine, http)
                seen.append(engine.healthy)
            return seen

    assert asyncio.run(probes()) == [False, False, True]
    assert engine.outages == 1 and engine.failures == 2
    assert engine.versions.pick("policy") == "policy-v2"


# ---- settings -------------------------------------------------------------------------------
def test_one_upstream_url_is_a_pool_of_one_and_a_list_replaces_it():
    assert GatewaySettings(upstream_url="http://x:1/v1/").engine_urls() == ["http://x:1/v1"]
    assert GatewaySettings(upstream_urls=[A, B]).engine_urls() == [A, B]
    # settings copied in code (tests, the demo) keep working with the one URL
    copied = GatewaySettings().model_copy(update={"upstream_url": C})
    assert copied.engine_urls() == [C]


def test_bad_upstream_urls_are_each_named(monkeypatch):
    monkeypatch.setenv("TRACETRAIN_GATEWAY__UPSTREAM_URLS",
                       f'["{A}", "ftp://x/v1", "{A}/", "http://:9/v1"]')
    monkeypatch.setenv("TRACETRAIN_RELOADER__ENGINE_URLS", '["http://e:1", "e:2"]')
    with pytest.raises(ConfigError) as err:
        load_settings()
    text = "\n".join(err.value.problems)
    assert "TRACETRAIN_GATEWAY__UPSTREAM_URLS" in text and "TRACETRAIN_RELOADER__ENGINE_URLS" in text
    assert "[1] 'ftp://x/v1': scheme 'ftp' is not http or https" in text
    assert f"[2] '{A}/': listed twice" in text and "[3] 'http://:9/v1': no host" in text
    assert "[1] 'e:2'" in text


def test_an_upstream_url_outside_the_list_is_refused(monkeypatch):
    monkeypatch.setenv("TRACETRAIN_GATEWAY__UPSTREAM_URL", C)
    monkeypatch.setenv("TRACETRAIN_GATEWAY__UPSTREAM_URLS", f'["{A}", "{B}"]')
    with pytest.raises(ConfigError, match="is not among upstream_urls"):
        load_settings()
    monkeypatch.setenv("TRACETRAIN_GATEWAY__UPSTREAM_URL", A)
    assert load_settings().gateway.engine_urls() == [A, B]
