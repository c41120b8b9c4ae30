"""Staleness with vLLM, which reports no policy version: the reloader's client loads each
version also as `policy-v<N>`, the real gateway (in front of testkit's vLLM DOUBLE, a small real
HTTP server that answers like vLLM, not vLLM) sends calls for `policy` to the newest such name
and records the version on the span, and the learner's batcher drops a transition built from a
stale span as it drops one of the embedded engine's (test_learner_kafka's staleness test)."""

from __future__ import annotations

import time

import httpx
import pytest
from pydantic import SecretStr

from infra import processes
from learner.batches import TransitionBatcher
from serving.engine_client import EngineClient
from streams.join_core import RolloutJoin
from testkit.fixed_upstream import ServerThread
from testkit.learner import learner_settings, produce
from testkit.metrics import get_state
from testkit.producers import consume, running_gateway
from testkit.vllm_double import VllmDouble

pytestmark = pytest.mark.integration


@pytest.fixture
def gateway_on_vllm(kafka_settings, tmp_path):
    double = VllmDouble()
    vllm = ServerThread(double.app(), processes.free_port()).start()
    with running_gateway(kafka_settings, vllm.url + "/v1", tmp_path / "spool", "gw-vllm",
                         api_keys=[SecretStr("k")], versions_refresh_s=0.1) as (url, settings, pub):
        yield url, settings, pub, EngineClient(vllm.url, "vllm"), double
    vllm.stop()


def _call(url: str, rollout: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=30,
                      headers={"Authorization": "Bearer k", "X-Rollout-Id": rollout},
                      json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]})


def test_vllm_spans_carry_the_served_version_and_stale_ones_are_dropped(
        gateway_on_vllm, tiny_model_dir, tmp_path):
    url, settings, pub, engine, double = gateway_on_vllm
    for version, rollout in ((5, "ro-old"), (9, "ro-new")):
        engine.load_lora(str(tmp_path / f"v{version}"), version)
        deadline = time.monotonic() + 10
        while (seen := get_state(url)["served_versions"]) != {"policy": f"policy-v{version}"}:
            assert time.monotonic() < deadline, seen  # the gateway reads the new name
            time.sleep(0.05)
        resp = _call(url, rollout)
        assert resp.status_code == 200 and resp.json()["model"] == f"policy-v{version}"
    assert pub.flush(20) == 0
    spans = [s for _, s in consume(settings.kafka.bootstrap_servers, settings.topics.spans, 2,
                                   settle_s=1.0)]
    # vLLM sent no version header or field: the version came from the served name.
    assert {(s["rollout_id"], s["llm"]["model"], s["llm"]["policy_version"]) for s in spans} \
        == {("ro-old", "policy", 5), ("ro-new", "policy", 9)}
    assert all(c[2]["model"] != "policy" for c in double.calls if c[1] == "/v1/chat/completions")

    # The spans joined into transitions as the streams worker does (one call per rollout and
    # its final reward), then the learner at version 11 with max_staleness 2.
    join = RolloutJoin(settings.streams)
    transitions = []
    for ts, span in enumerate(spans, start=1):
        join.span(span, 0, ts, 1.0)
        state = join.reward({"rollout_id": span["rollout_id"], "value": 1.0, "final": True,
                             "timestamp_ns": 100 + ts}, 0, 100 + ts, 1.0).state
        transitions += state.transitions("final", "identical", 1.0, 60.0)
    assert {t["policy_version"] for t in transitions} == {5, 9}
    learner = learner_settings(settings, tiny_model_dir, batch_size=50, batch_timeout_s=3.0,
                               max_staleness=2)
    produce(learner, transitions)
    batcher = TransitionBatcher(learner, vocab_size=49152)
    try:
        batch = batcher.next_batch(current_version=11, first_wait_s=60)
    finally:
        batcher.close()
    assert [t["rollout_id"] for t in batch.transitions] == ["ro-new"]
    assert batcher.counters["stale"] == 1 and batcher.counters["accepted"] == 1
