"""The join on OTLP traffic, called directly: spans an OTLP exporter posts (OTLP/JSON, GenAI
attributes, no token ids), mapped as the gateway's receiver maps them, become transitions
marked re-tokenised, without behaviour logprobs, beside a gateway call's transition that keeps
its own; a call whose messages were not captured is dead-lettered with its reason and its
rollout still trains on the others; with re-tokenisation off such calls are "no token ids"."""

from __future__ import annotations

import json
import random

import pytest

from producers.gateway.otlp import _checked_spans, _from_json
from schemas import Codec
from streams.chat_tokenizer import ChatTokenizer
from streams.cleaning import NO_TOKEN_IDS
from streams.close_rules import plan_close
from streams.join_core import RolloutJoin
from streams.recorded_call import NO_MESSAGES
from streams.retokenize import Retokenizer
from testkit.genai import chat_attributes, otlp_request
from testkit.workload import _llm_span
from tracetrain.settings.streams import StreamsSettings

TRACE = "5b8efff798038103d269b633813fc60c"
ROLLOUT = f"otel-{TRACE}"  # one trace is one rollout when no tracetrain.rollout_id is set
QUESTION = {"role": "user", "content": "What is 2 + 3?"}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add.",
                                           "parameters": {"type": "object"}}}]


def _otlp_spans() -> list[dict]:
    """An agent's trace as its OTLP exporter sends it: a tool-calling chat, the tool, the
    answering chat, and a chat recorded with content capture off."""
    asking = chat_attributes([QUESTION], {"role": "assistant", "content": None,
                                          "tool_calls": [CALL]}, "tool_calls", TOOLS,
                             **{"gen_ai.request.temperature": 0.7})
    answering = chat_attributes(
        [QUESTION, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": "5"}],
        {"role": "assistant", "content": "The answer is 5."}, "stop", TOOLS)
    uncaptured = {k: v for k, v in answering.items()
                  if k not in ("gen_ai.input.messages", "gen_ai.output.messages")}
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "add",
            "gen_ai.tool.call.arguments": '{"a": 2, "b": 3}', "gen_ai.tool.call.result": "5"}
    body = otlp_request([
        {"span_id": "00000000000000a1", "name": "chat policy", "start_ns": 100,
         "attributes": asking},
        {"span_id": "00000000000000a2", "name": "execute_tool add", "start_ns": 200,
         "attributes": tool},
        {"span_id": "00000000000000a3", "name": "chat policy", "start_ns": 300,
         "attributes": answering},
        {"span_id": "00000000000000a4", "name": "chat policy", "start_ns": 400,
         "attributes": uncaptured},
    ], TRACE, resource={"service.name": "otel-agent", "tracetrain.task_id": "add-2-3"})
    spans, rejected = _checked_spans(_from_json(json.loads(json.dumps(body))))
    assert rejected == []
    return spans


@pytest.fixture(scope="module")
def tokenizer(base_model_dir):
    return ChatTokenizer(base_model_dir)


def _close(core: RolloutJoin, key: bytes):
    state = core.reward({"rollout_id": key.decode(), "value": 1.0, "final": True,
                         "timestamp_ns": 9, "span_id": None}, 0, 500, 1.0).state
    return plan_close(state, "final", core.cfg, "spans", "air", core.max_reward)


def test_otlp_calls_become_retokenised_transitions(base_model_dir, tokenizer):
    core = RolloutJoin(StreamsSettings(credit="air"),
                       retokenize=Retokenizer(lambda: base_model_dir))
    spans = _otlp_spans()
    assert [s["kind"] for s in spans] == ["llm", "tool", "llm", "llm"]
    assert all(not s["llm"]["prompt_token_ids"] for s in spans if s["llm"])
    applied = [core.span(span, 0, 10 + i, 1.0) for i, span in enumerate(spans)]
    assert [a.new_call for a in applied] == ["00000000000000a1", None, "00000000000000a3", None]
    assert [a.dead for a in applied[:3]] == [[], [], []]
    [(reason, detail)] = applied[3].dead
    assert reason == NO_MESSAGES and "00000000000000a4" in detail and "CAPTURE_MESSAGE_CONTENT" \
        in detail
    for again in (spans[0], spans[3]):  # an exporter's retry: no second call, no second letter
        copy = core.span(again, 0, 20, 1.0)
        assert copy.outcome == "duplicate" and copy.dead == [] and copy.new_call is None
    plan = _close(core, ROLLOUT.encode())
    assert plan.dead_letters == []
    asking, answering = plan.transitions
    for t in plan.transitions:
        assert t["retokenized"] and t["behaviour_logprobs"] == []
        assert t["task_id"] == "add-2-3" and t["policy_version"] is None
    assert asking["sampling_temperature"] == 0.7 and answering["sampling_temperature"] is None
    # the tool's AIR credits the call that asked for it (credit "air": 1.0 + tool_ok 0.1)
    assert (asking["credited_return"], answering["credited_return"]) == (1.1, 1.0)
    assert tokenizer.decode(asking["response_token_ids"]) == \
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert tokenizer.decode(answering["response_token_ids"]) == "The answer is 5."
    assert answering["response_token_ids"][-1] == 2  # <|im_end|>: the model ended its turn
    prompt = tokenizer.decode(answering["prompt_token_ids"])
    assert prompt.startswith("system\nYou are a function calling AI model")
    assert "<tool_response>\n5\n</tool_response>" in prompt
    # the next call's prompt holds the previous call's prompt and response, token for token
    assert answering["prompt_token_ids"][:len(asking["prompt_token_ids"])] == \
        asking["prompt_token_ids"]
    codec = Codec()
    assert codec.decode(codec.encode("Transition", answering)) == answering


def test_a_rollout_mixing_gateway_and_otlp_calls_keeps_each_ones_logprobs(base_model_dir):
    core = RolloutJoin(StreamsSettings(), retokenize=Retokenizer(lambda: base_model_dir))
    gateway_call = _llm_span(ROLLOUT, "00000000000000b0", "", 50, random.Random(0))
    core.span(gateway_call, 0, 1, 1.0)
    core.span(_otlp_spans()[2], 0, 2, 1.0)
    ours, theirs = _close(core, ROLLOUT.encode()).transitions
    assert not ours["retokenized"] and ours["behaviour_logprobs"] == \
        gateway_call["llm"]["response_logprobs"]
    assert ours["prompt_token_ids"] == gateway_call["llm"]["prompt_token_ids"]
    assert theirs["retokenized"] and theirs["behaviour_logprobs"] == []


def test_with_retokenisation_off_otlp_calls_are_dead_letters():
    core = RolloutJoin(StreamsSettings())  # the adapter passes no retokenizer when it is off
    applied = core.span(_otlp_spans()[2], 0, 1, 1.0)
    assert applied.changed and applied.new_call is None
    [(reason, detail)] = applied.dead
    assert reason == NO_TOKEN_IDS and "streams.retokenize is off" in detail
