"""A real framework through the gateway: an OpenAI Agents SDK agent with one tool, only its
base URL pointed at the gateway (a rollout path prefix), runs a two-step task (tool call, then
answer); both LLM calls arrive on Kafka as spans of one rollout."""

from __future__ import annotations

import asyncio
import json

import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from testkit.producers import consume

pytestmark = pytest.mark.integration


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_agents_sdk_two_step_tool_run_is_one_rollout(gateway):
    url, settings, pub = gateway
    set_tracing_disabled(True)  # the SDK's own trace export goes to api.openai.com
    client = AsyncOpenAI(base_url=url + "/rollouts/ro-agent-1/v1", api_key="key-1", max_retries=0)
    agent = Agent(name="calculator", instructions="Use the add tool.", tools=[add],
                  model=OpenAIChatCompletionsModel(model="fixed-model", openai_client=client))
    result = asyncio.run(Runner.run(agent, "What is 2 + 3?"))
    assert result.final_output == "The answer is 5."
    assert pub.flush(20) == 0
    spans = [s for _k, s in consume(settings.kafka.bootstrap_servers, settings.topics.spans, 2,
                                    settle_s=0.5)]
    assert [s["rollout_id"] for s in spans] == ["ro-agent-1", "ro-agent-1"]
    first, second = sorted(spans, key=lambda s: s["start_time_ns"])
    assert json.loads(first["attributes"]["tool_calls"])[0]["function"]["name"] == "add"
    assert first["llm"]["finish_reason"] == "tool_calls"
    assert "add" in first["attributes"]["tools"]
    sent = json.loads(second["llm"]["request_messages"])
    assert any(m.get("role") == "tool" and m.get("content") == "5" for m in sent)
    assert second["llm"]["response_text"] == "The answer is 5."
    assert all(s["llm"]["response_token_ids"] for s in spans)
