"""Each AIR rule on a span that triggers it, and the span each event credits."""

from __future__ import annotations

import pytest

from streams.air_rules import AirRules
from tracetrain.settings.streams import AirRuleSettings


def tool_span(**kw):
    span = {"span_id": "tool1", "rollout_id": "r", "kind": "tool", "parent_id": "llm1",
            "status": "ok", "error_message": None, "attributes": {}, "end_time_ns": 5,
            "llm": None, "tool": {"name": "calc", "arguments": '{"x": 1}', "result": "2", "ok": True}}
    span.update(kw)
    return span


def llm_span(text="hello", **attrs):
    return {"span_id": "llm1", "rollout_id": "r", "kind": "llm", "parent_id": None, "status": "ok",
            "error_message": None, "attributes": attrs, "end_time_ns": 7, "tool": None,
            "llm": {"model": "m", "response_text": text}}


RULES = AirRules(AirRuleSettings())


@pytest.mark.parametrize("span, rule", [
    (tool_span(), "tool_ok"),
    (tool_span(status="error", error_message="ZeroDivisionError"), "tool_raised"),
    (tool_span(tool={"name": "calc", "arguments": "{}", "ok": False}), "tool_raised"),
    (tool_span(status="error", error_message="call timed out after 30s"), "tool_timeout"),
    (tool_span(status="error", attributes={"tool.timed_out": "true"}), "tool_timeout"),
    (tool_span(attributes={"exit_code": "2"}), "nonzero_exit"),
    (tool_span(attributes={"sql.error": "no such table: users"}), "sql_error"),
    (tool_span(tool={"name": "calc", "arguments": "{x: 1", "ok": True}), "malformed_tool_call"),
    (llm_span("{not json", response_format="json_object"), "json_parse_failure"),
    (llm_span("x", **{"llm.tool_calls": '[{"function": {"arguments": "{}"}}]'}), "malformed_tool_call"),
])
def test_rule_fires_with_its_value_and_credited_span(span, rule):
    events = RULES.derive(span)
    hit = [e for e in events if e["rule"] == rule]
    assert len(hit) == 1, events
    assert hit[0]["value"] == getattr(AirRuleSettings(), rule)
    assert hit[0]["span_id"] == "llm1"  # tool rules credit the calling LLM span
    assert hit[0]["source"] == "derived" and hit[0]["rollout_id"] == "r"


def test_clean_spans_fire_nothing_bad():
    assert [e["rule"] for e in RULES.derive(tool_span())] == ["tool_ok"]
    assert RULES.derive(llm_span('{"a": 1}', response_format="json")) == []
    assert RULES.derive(llm_span("plain text")) == []
    assert RULES.derive(tool_span(attributes={"exit_code": "0"}))[0]["rule"] == "tool_ok"
    good_calls = '[{"function": {"name": "calc", "arguments": "{\\"x\\": 1}"}}]'
    assert RULES.derive(llm_span("x", **{"llm.tool_calls": good_calls})) == []


def test_caller_attribute_wins_and_zero_disables():
    span = tool_span(parent_id=None, attributes={"tracetrain.caller_span_id": "llm9"})
    assert RULES.derive(span)[0]["span_id"] == "llm9"
    assert RULES.derive(tool_span(parent_id=None))[0]["span_id"] == "tool1"
    off = AirRules(AirRuleSettings(tool_ok=0.0))
    assert off.derive(tool_span()) == []
