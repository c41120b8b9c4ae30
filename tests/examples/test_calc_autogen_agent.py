"""The AutoGen front end of the calc task: AutoGen AgentChat's own tool loop, through the real
gateway onto the real broker. The policy behind the gateway is a scripted OpenAI-compatible
server (a stand-in whose fixed tool calls make the loop checkable: SmolLM2-135M emits a
well-formed tool call too rarely for a test); a last test runs the agent on the real engine."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from test_calc_agent import _drain

from examples.calc.autogen_agent import AutoGenCalcAgent
from examples.calc.problems import Problem
from infra import processes
from producers.gateway.app import create_app
from producers.publisher import Publisher
from producers.tracer import Tracer
from testkit.fixed_upstream import ServerThread

pytestmark = pytest.mark.integration
PROBLEM = Problem("What is 17 times 23?", 391, 1, "17*23")


def tool_calling_policy(expression: str, answer: str, seen: list[dict]) -> FastAPI:
    """First turn: a `calc` tool call with `expression`; every later turn: `answer`."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append(body)
        if len(seen) == 1:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "calc", "arguments": json.dumps({"expression": expression})}}]}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": answer}, "stop"
        return {"id": f"x{len(seen)}", "object": "chat.completion", "created": 0,
                "model": body["model"], "choices": [{"index": 0, "finish_reason": finish,
                                                     "message": message}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}

    return app


@pytest.mark.parametrize("expression, answer, reward, tool_ok", [
    ("17 * 23", "ANSWER: 391", 1.0, True),
    ("__import__('os')", "ANSWER: 5", 0.0, False),
])
def test_autogen_tool_loop_is_traced_through_the_gateway(kafka_settings, tmp_path, expression,
                                                         answer, reward, tool_ok):
    seen: list[dict] = []
    policy = ServerThread(tool_calling_policy(expression, answer, seen), processes.free_port()).start()
    settings = kafka_settings.model_copy(update={"gateway": kafka_settings.gateway.model_copy(
        update={"upstream_url": policy.url + "/v1", "request_token_ids": False})})
    gateway_pub = Publisher(settings, name="gw", spool_dir=tmp_path / "gw-spool")
    gateway = ServerThread(create_app(settings, publisher=gateway_pub), processes.free_port()).start()
    agent_pub = Publisher(settings, name="agent", spool_dir=tmp_path / "agent-spool")
    try:
        agent = AutoGenCalcAgent(gateway.url + "/v1", tracer=Tracer(agent_pub, agent="calc-autogen"),
                                 temperature=0.0)
        episode = agent.solve(PROBLEM, task_id="t-17x23", seed=3)
        agent_pub.flush()
        gateway_pub.flush()
    finally:
        gateway.stop()
        policy.stop()
        agent_pub.close()
        gateway_pub.close()

    assert episode.reward == reward and episode.tool_calls == 1
    assert episode.tool_errors == (0 if tool_ok else 1)
    # AutoGen offered the calculator as an OpenAI function tool, after the demonstration.
    assert [t["function"]["name"] for t in seen[0]["tools"]] == ["calc"]
    assert "expression" in seen[0]["tools"][0]["function"]["parameters"]["properties"]
    assert any(m.get("tool_calls") for m in seen[0]["messages"])  # the demonstrated call
    # The tool's result (or its error) went back to the policy as a tool message.
    fed_back = [m for m in seen[1]["messages"] if m["role"] == "tool"][-1]
    assert fed_back["tool_call_id"] == "call_1"
    if tool_ok:
        assert fed_back["content"] == "391"
    else:
        assert "is not allowed: only numbers" in fed_back["content"]

    spans = _drain(settings, settings.topics.spans, episode.rollout_id, 4, "Span")
    llm = [s for s in spans if s["kind"] == "llm"]
    tools = [s for s in spans if s["kind"] == "tool"]
    assert len(llm) == 2 and {s["task_id"] for s in llm} == {"t-17x23"}  # from the gateway
    assert {s["agent_name"] for s in llm} == {"calc-autogen"}
    assert len(tools) == 1 and tools[0]["tool"]["name"] == "calc"
    assert tools[0]["tool"]["ok"] is tool_ok
    assert json.loads(tools[0]["tool"]["arguments"]) == {"expression": expression}
    rewards = _drain(settings, settings.topics.rewards, episode.rollout_id, 1, "Reward")
    assert [(r["value"], r["final"]) for r in rewards] == [(reward, True)]


def test_autogen_agent_runs_on_the_real_engine(engine_url):
    """AutoGen's requests (tools, tool-call history) are accepted by the embedded engine and
    its answers parsed by AutoGen, greedily and repeatably."""
    agent = AutoGenCalcAgent(engine_url + "/v1", temperature=0.0, max_tokens=24)
    first = agent.solve(PROBLEM, task_id="real-1", seed=1)
    again = agent.solve(PROBLEM, task_id="real-1", seed=1)
    assert first.transcript[0]["content"] == PROBLEM.question
    assert len(first.transcript) >= 2 and first.final_text
    assert first.reward in (0.0, 1.0)
    assert again.final_text == first.final_text  # greedy: the same answer twice
