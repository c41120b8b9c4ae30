"""The calc agent against a scripted OpenAI-compatible server (a stand-in for the policy, whose
answers are fixed so that the agent's tool loop can be checked), with the real tracer and
publisher writing to the real broker."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer
from fastapi import FastAPI, Request

from examples.calc.agent import SYSTEM_PROMPT, CalcAgent, steps
from examples.calc.problems import Problem
from examples.errors import ExamplesError
from infra import processes
from producers.publisher import Publisher
from producers.tracer import Tracer
from schemas import Codec
from testkit.fixed_upstream import ServerThread

pytestmark = pytest.mark.integration
PROBLEM_17X23 = Problem("What is 17 times 23?", 391, 1, "17*23")


def scripted_policy(replies: list[str], seen: list[dict]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append({"headers": dict(request.headers), "messages": body["messages"]})
        text = replies[min(len(seen) - 1, len(replies) - 1)]
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    return app


def _drain(settings, topic: str, rollout_id: str, want: int, name: str) -> list[dict]:
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                         "group.id": f"calc-{topic}-{rollout_id}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    found, deadline = [], time.monotonic() + 30
    while len(found) < want and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            record = Codec().decode(msg.value(), name)
            if record["rollout_id"] == rollout_id:
                found.append(record)
    consumer.close()
    return found


@pytest.mark.parametrize("replies, reward, tool_ok, fed_back_says", [
    (["<tool>calc: 17*23", "ANSWER: 391"], 1.0, True, "Result: 391"),
    (["<tool>calc: import os", "ANSWER: 5"], 0.0, False, "is not an arithmetic expression"),
    # an overflow is a failed tool call the policy is told about, not a crashed episode
    (["<tool>calc: 1e999 * 2", "ANSWER: 5"], 0.0, False, "overflows"),
])
def test_agent_uses_the_tool_and_is_rewarded(kafka_settings, tmp_path, replies, reward, tool_ok,
                                             fed_back_says):
    seen: list[dict] = []
    port = processes.free_port()
    server = ServerThread(scripted_policy(replies, seen), port).start()
    publisher = Publisher(kafka_settings, name="calc-test", spool_dir=tmp_path / "spool")
    try:
        agent = CalcAgent(f"http://127.0.0.1:{port}/v1", tracer=Tracer(publisher, agent="calc"))
        episode = agent.solve(Problem("What is 17 times 23?", 391, 1, "17*23"), task_id="t-17x23")
        publisher.flush()
    finally:
        publisher.close()
        server.stop()
    assert episode.reward == reward and episode.tool_calls == 1
    assert episode.tool_errors == (0 if tool_ok else 1)
    # The tool result went back to the policy as the next user turn.
    fed_back = seen[1]["messages"][-1]["content"]
    if tool_ok:
        assert fed_back == fed_back_says
    else:
        assert fed_back.startswith("Error: ") and fed_back_says in fed_back
    assert all(s["headers"]["x-rollout-id"] == episode.rollout_id for s in seen)
    assert seen[0]["headers"]["x-task-id"] == "t-17x23"
    spans = _drain(kafka_settings, kafka_settings.topics.spans, episode.rollout_id, 2, "Span")
    tools = [s for s in spans if s["kind"] == "tool"]
    assert len(tools) == 1 and tools[0]["tool"]["name"] == "calc"
    assert tools[0]["tool"]["ok"] is tool_ok
    rewards = _drain(kafka_settings, kafka_settings.topics.rewards, episode.rollout_id, 1, "Reward")
    assert [(r["value"], r["final"]) for r in rewards] == [(reward, True)]


def test_an_injected_system_prompt_is_what_the_policy_is_sent():
    seen: list[dict] = []
    port = processes.free_port()
    server = ServerThread(scripted_policy(["ANSWER: 391"], seen), port).start()
    try:
        default = CalcAgent(f"http://127.0.0.1:{port}/v1").solve(PROBLEM_17X23)
        tuned = CalcAgent(f"http://127.0.0.1:{port}/v1", system_prompt="Be exact.").solve(PROBLEM_17X23)
    finally:
        server.stop()
    assert default.reward == tuned.reward == 1.0
    assert seen[0]["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert seen[1]["messages"][0] == {"role": "system", "content": "Be exact."}
    assert seen[1]["messages"][1:] == seen[0]["messages"][1:]  # only the system prompt changed


@pytest.mark.parametrize("kwargs, says", [
    ({"prompt_uri": "calc-system@production"}, "expected prompts:/NAME@ALIAS"),
    ({"prompt_uri": "prompts:/x@y", "system_prompt": "z"}, "not both"),
])
def test_a_prompt_the_agent_cannot_take_is_refused_by_name(kwargs, says):
    with pytest.raises(ExamplesError, match=says):
        CalcAgent("http://127.0.0.1:9/v1", **kwargs)


def test_a_stepwise_rollout_computes_one_operation_a_call_on_the_results_before_it():
    """`steps`: three operations, three calls, each fed the result before it, then the
    answer; the four calls fit in the style's turns."""
    seen: list[dict] = []
    port = processes.free_port()
    replies = ["<tool>calc: 4 * 26", "<tool>calc: 104 - 103", "<tool>calc: 1 * 6", "ANSWER: 6"]
    server = ServerThread(scripted_policy(replies, seen), port).start()
    try:
        episode = CalcAgent(f"http://127.0.0.1:{port}/v1", style="steps").solve(
            Problem("Nadia saves 26 pounds a week for 4 weeks, spends 103, and the bank gives "
                    "her six times what is left. How much has she?", 6, 3, "(4 * 26 - 103) * 6"))
    finally:
        server.stop()
    assert episode.reward == 1.0 and episode.tool_calls == 3 and len(seen) == 4
    assert [s["messages"][-1]["content"] for s in seen[1:]] == [
        "Result: 104", "Result: 1", "Result: 6"]


@pytest.mark.parametrize("expression, expected", [
    ("(4 * 26 - 103) * 6", ["4 * 26", "104 - 103", "1 * 6"]),
    ("64 * 12 + 30 * 4", ["64 * 12", "30 * 4", "768 + 120"]),  # two products, then their sum
    ("50 - 7 * 4", ["7 * 4", "50 - 28"]),
    ("23 + (23 + 5)", ["23 + 5", "23 + 28"]),
    ("(369 / 9 - 23) / 2", ["369 / 9", "41 - 23", "18 / 2"]),
    ("42", ["42"]),  # no operation: the number itself is the one call
])
def test_steps_are_the_operations_in_the_order_they_are_computed(expression, expected):
    assert steps(expression) == expected


@pytest.mark.parametrize("expression, says", [
    ("2 ** 3", "only \\+ - \\* /"), ("1.5 * 2", "whole numbers"), ("x + 1", "whole numbers")])
def test_steps_name_an_expression_they_cannot_split(expression, says):
    with pytest.raises(ExamplesError, match=says):
        steps(expression)


def test_an_unknown_style_is_refused_with_the_styles_there_are():
    with pytest.raises(ExamplesError, match="'whole': expected one of steps, expression"):
        CalcAgent("http://127.0.0.1:9/v1", style="whole")
