"""Automatic intermediate rewards (AIR): named rules that turn system signals on a span into
AirEvents. Values come from settings (`TRACETRAIN_STREAMS__AIR_RULES__TOOL_RAISED=-1`); a rule
with value 0 is off. Pure: `derive(span)` returns the events, the Faust agent publishes them.
JSON the rules must read but the decoder cannot (nested past its recursion limit) raises
`PoisonSpan`: the join dead-letters that span instead of joining it.

Which span an event credits: an LLM span's rules credit that call; a tool span's rules credit
the call that issued the tool call (attribute `tracetrain.caller_span_id`, else `parent_id`,
else the tool span itself, which the join maps to the latest policy call before it).
"""

from __future__ import annotations

import json
import re
import sys

from streams.errors import StreamsError
from tracetrain.records import AirEvent, Span
from tracetrain.settings.streams import AirRuleSettings

JSON_FORMATS = {"json", "json_object", "json_schema"}
JSON_TOO_DEEP = "json_too_deep"


class PoisonSpan(StreamsError):
    """A span the rules cannot read; `reason` is its DLQ reason. Caught by the join core."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(detail)


def _loads(text: str, field: str):
    """json.loads, with JSON nested past the decoder's recursion limit a PoisonSpan (a
    RecursionError would crash the agent on the same record again and again)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise PoisonSpan(JSON_TOO_DEEP, f"{field} ({len(text)} characters) is JSON nested "
                         f"deeper than the decoder's limit (about {sys.getrecursionlimit()} "
                         "levels); expected JSON a reader can parse") from None


def _credited_for_tool(span: dict) -> str:
    attrs = span.get("attributes") or {}
    return attrs.get("tracetrain.caller_span_id") or span.get("parent_id") or span["span_id"]


def _is_json(text: str | None, field: str, want_object: bool = False) -> bool:
    if text is None:
        return False
    try:
        value = _loads(text, field)
    except (ValueError, TypeError):
        return False
    return isinstance(value, dict) if want_object else True


def _exit_code_nonzero(attrs: dict) -> bool:
    for name in ("exit_code", "process.exit_code"):
        if name in attrs:
            try:
                return int(attrs[name]) != 0
            except ValueError:
                return True  # an exit code that is not a number is not a clean exit
    return False


class AirRules:
    def __init__(self, rules: AirRuleSettings):
        self.rules = rules
        self.timeout = re.compile(rules.timeout_pattern)

    def fired(self, span: Span) -> list[tuple[str, str]]:
        """(rule name, credited span id) of every rule that applies to `span`."""
        attrs = span.get("attributes") or {}
        hits: list[tuple[str, str]] = []
        tool, llm = span.get("tool"), span.get("llm")
        if span.get("kind") == "tool" or tool is not None:
            credited = _credited_for_tool(span)
            failed = span.get("status") == "error" or (tool is not None and not tool.get("ok", True))
            message = span.get("error_message") or ""
            if failed and (self.timeout.search(message) or attrs.get("tool.timed_out") == "true"):
                hits.append(("tool_timeout", credited))
            elif failed:
                hits.append(("tool_raised", credited))
            else:
                hits.append(("tool_ok", credited))
            if tool is not None and not _is_json(tool.get("arguments"), "tool.arguments",
                                                 want_object=True):
                hits.append(("malformed_tool_call", credited))
        else:
            credited = span["span_id"]
        if _exit_code_nonzero(attrs):
            hits.append(("nonzero_exit", credited))
        if attrs.get("db.error") or attrs.get("sql.error"):
            hits.append(("sql_error", credited))
        if llm is not None:
            wants_json = attrs.get("response_format") in JSON_FORMATS
            if wants_json and not _is_json(llm.get("response_text"), "llm.response_text"):
                hits.append(("json_parse_failure", span["span_id"]))
            calls = attrs.get("llm.tool_calls")
            if calls is not None and not _valid_tool_calls(calls):
                hits.append(("malformed_tool_call", span["span_id"]))
        return hits

    def derive(self, span: Span, timestamp_ns: int | None = None) -> list[AirEvent]:
        """AirEvent records for `span` (rules with value 0 are off)."""
        events: list[AirEvent] = []
        for rule, credited in self.fired(span):
            value = getattr(self.rules, rule)
            if value == 0:
                continue
            events.append({"rollout_id": span["rollout_id"], "span_id": credited, "rule": rule,
                           "value": float(value), "source": "derived",
                           "timestamp_ns": timestamp_ns if timestamp_ns is not None else span["end_time_ns"]})
        return events


def _valid_tool_calls(text: str) -> bool:
    """`llm.tool_calls` is the OpenAI list of calls: each needs a function name and JSON args."""
    try:
        calls = _loads(text, "attribute llm.tool_calls")
    except ValueError:
        return False
    if not isinstance(calls, list):
        return False
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not function.get("name"):
            return False
        if not _is_json(function.get("arguments", "{}"), "llm.tool_calls arguments",
                        want_object=True):
            return False
    return True
