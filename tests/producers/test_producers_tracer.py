"""The in-process tracer on the real broker: tool spans (ok and failing), LLM spans, the
rollout's agent span and its reward, with context carried into asyncio tasks and threads."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from producers.publisher import Publisher
from producers.tracer import Tracer
from testkit.producers import consume

pytestmark = pytest.mark.integration


def test_rollout_tools_llm_reward_and_context_propagation(kafka_settings, tmp_path):
    pub = Publisher(kafka_settings, name="tracer-test", spool_dir=tmp_path / "spool")
    tracer = Tracer(pub, agent="solver", service="unit")

    @tracer.tool
    def calc(expr: str, scale: int = 1) -> int:
        return eval(expr, {}) * scale  # noqa: S307  (a test tool)

    @tracer.tool(name="lookup")
    async def fetch(key: str) -> dict:
        await asyncio.sleep(0.01)
        if key == "missing":
            raise KeyError(key)
        return {"key": key}

    async def both():
        return await asyncio.gather(fetch("a"), fetch("missing"), return_exceptions=True)

    assert calc("1+1") == 2  # outside a rollout: runs, records nothing
    with tracer.rollout(task_id="t-1") as r:
        assert calc("2+3", scale=2) == 10
        with pytest.raises(ZeroDivisionError):
            calc("1/0")
        found, missing = asyncio.run(both())
        assert found == {"key": "a"} and isinstance(missing, KeyError)
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(tracer.propagate(calc), "7*6").result() == 42
        llm_id = r.llm(model="m", messages=[{"role": "user", "content": "q"}],
                       response_text="a", response_token_ids=[5, 6], response_logprobs=[-1, -2],
                       policy_version=3)
        r.reward(1.0)
    assert Tracer.current() is None
    assert pub.close(20) == 0
    spans = [s for _k, s in consume(kafka_settings.kafka.bootstrap_servers,
                                    kafka_settings.topics.spans, 7, settle_s=0.5)]
    assert len(spans) == 7 and {s["rollout_id"] for s in spans} == {r.rollout_id}
    assert all(s["trace_id"] == r.trace_id and s["task_id"] == "t-1" for s in spans)
    [agent] = [s for s in spans if s["kind"] == "agent"]
    assert agent["span_id"] == r.span_id and agent["status"] == "ok"
    tools = [s for s in spans if s["kind"] == "tool"]
    assert all(s["parent_id"] == r.span_id for s in tools)
    by_args = {(s["tool"]["name"], s["tool"]["arguments"]): s for s in tools}
    ok = by_args[("calc", json.dumps({"expr": "2+3", "scale": 2}))]
    assert ok["tool"]["ok"] and ok["tool"]["result"] == "10" and ok["status"] == "ok"
    bad = by_args[("calc", json.dumps({"expr": "1/0"}))]
    assert not bad["tool"]["ok"] and "ZeroDivisionError" in bad["error_message"]
    assert by_args[("lookup", json.dumps({"key": "a"}))]["tool"]["result"] == '{"key": "a"}'
    assert not by_args[("lookup", json.dumps({"key": "missing"}))]["tool"]["ok"]
    assert by_args[("calc", json.dumps({"expr": "7*6"}))]["tool"]["result"] == "42"
    [llm] = [s for s in spans if s["kind"] == "llm"]
    assert llm["span_id"] == llm_id and llm["llm"]["response_token_ids"] == [5, 6]
    assert llm["llm"]["policy_version"] == 3 and llm["agent_name"] == "solver"
    [(key, reward)] = consume(kafka_settings.kafka.bootstrap_servers,
                              kafka_settings.topics.rewards, 1, name="Reward", settle_s=0.3)
    assert key == r.rollout_id and reward["value"] == 1.0 and reward["final"]
