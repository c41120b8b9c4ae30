"""An LLM call as its span recorded it, back in OpenAI's chat shape: the request messages, the
tools it offered and the response message, for re-tokenising (`streams/retokenize.py`).

    call = recorded_call(span)      # RecordedCall, or Unrecoverable(reason, detail)

Spans carry a call in one of three shapes, and the log keeps every span ever written, so all
three are read:
- OpenAI messages (the gateway, the in-process tracer): `llm.request_messages` as sent;
- OpenTelemetry GenAI messages (`gen_ai.input.messages` / `gen_ai.output.messages`, messages
  of typed parts: text, tool_call, tool_call_response; opentelemetry-instrumentation-openai
  and -openai-v2 write them), with `gen_ai.system_instructions` and `gen_ai.tool.definitions`;
- the older indexed attributes (`gen_ai.prompt.N.*`, `gen_ai.completion.N.*`,
  `llm.request.functions.N.*`), which `producers.otel.to_span` folds into one dict a message,
  a tool call's fields under keys like `tool_calls.0.name`.

A call whose messages or response were not recorded (instrumentations record content only when
told to: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true) or cannot be read is
`Unrecoverable`, with the reason its dead letter gets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tracetrain.errors import TracetrainError

NO_MESSAGES, BAD_MESSAGES, NO_RESPONSE = "no_messages", "bad_messages", "no_response"
# Finish reasons of a response the model did not end itself (OpenAI's and GenAI's names).
CUT_OFF = frozenset({"length", "content_filter", "error"})


class Unrecoverable(TracetrainError):
    """The call cannot be rebuilt from its span (a bad record, not a stage that cannot go on):
    `reason` names why for its dead letter."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class RecordedCall:
    messages: list[dict]
    tools: list[dict] | None
    response: dict  # an assistant message
    ended: bool  # the model ended its turn (False: cut off by a length limit or a filter)


def _json(raw, what: str):
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise Unrecoverable(BAD_MESSAGES, f"{what} is not JSON: {exc}") from exc


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _from_parts(message: dict, what: str) -> list[dict]:
    """OpenAI messages for one GenAI message: tool results become one tool message each."""
    role, texts, calls, results = message.get("role"), [], [], []
    for part in message.get("parts") or []:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(_text(part.get("content") or ""))
        elif kind == "tool_call":
            calls.append({"id": part.get("id"), "type": "function", "function": {
                "name": part.get("name"), "arguments": _text(part.get("arguments") or {})}})
        elif kind == "tool_call_response":
            results.append({"role": "tool", "tool_call_id": part.get("id"),
                            "content": _text(part.get("response"))})
        else:
            raise Unrecoverable(BAD_MESSAGES, f"{what} ({role}) has a part of type {kind!r}; "
                                "expected text, tool_call or tool_call_response (the parts a "
                                "chat template renders as text)")
    if results:
        return results
    out = {"role": role, "content": "".join(texts) if texts or not calls else None}
    if calls:
        out["tool_calls"] = calls
    return [out]


def _indexed(flat: dict, prefix: str) -> list[dict]:
    """`{"tool_calls.0.name": ...}` -> [{"name": ...}]"""
    items: dict[int, dict] = {}
    for key, value in flat.items():
        if key.startswith(prefix + "."):
            index, _, rest = key[len(prefix) + 1:].partition(".")
            if index.isdigit() and rest:
                items.setdefault(int(index), {})[rest] = value
    return [items[i] for i in sorted(items)]


def _from_flat(message: dict) -> dict:
    """An OpenAI message, or one of the indexed attributes' (tool calls flattened)."""
    content = message.get("content")
    if isinstance(content, list) and any(
            not isinstance(part, dict) or part.get("type", "text") != "text" for part in content):
        # an image or audio part: the template would render the text alone, a prompt the
        # model never saw
        kinds = sorted({str(part.get("type")) if isinstance(part, dict) else
                        type(part).__name__ for part in content})
        raise Unrecoverable(BAD_MESSAGES, f"a {message.get('role')} message has parts of "
                            f"types {kinds}; only text parts can be re-tokenised")
    calls = _indexed(message, "tool_calls")
    out = {k: v for k, v in message.items() if not k.startswith("tool_calls.")}
    if calls:
        out["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": {
            "name": c.get("name"), "arguments": _text(c.get("arguments") or "{}")}}
            for c in calls]
    return out


def _messages(raw, what: str) -> list[dict]:
    messages = _json(raw, what)
    if not isinstance(messages, list):
        raise Unrecoverable(BAD_MESSAGES, f"{what} is {type(messages).__name__}; expected a list")
    out: list[dict] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise Unrecoverable(BAD_MESSAGES, f"{what}[{i}] has no role: {str(message)[:200]}")
        out += _from_parts(message, f"{what}[{i}]") if "parts" in message else [_from_flat(message)]
    return out


def _system(attrs: dict) -> list[dict]:
    raw = attrs.get("gen_ai.system_instructions")
    if not raw:
        return []
    parts = _json(raw, "gen_ai.system_instructions")
    if isinstance(parts, str):
        return [{"role": "system", "content": parts}]
    return _from_parts({"role": "system", "parts": parts}, "gen_ai.system_instructions")


def _tools(attrs: dict) -> list[dict] | None:
    raw = attrs.get("gen_ai.tool.definitions")
    if raw:
        tools = _json(raw, "gen_ai.tool.definitions")
    else:
        tools = _indexed({k: v for k, v in attrs.items() if k.startswith("llm.request.functions.")},
                         "llm.request.functions")
        for tool in tools:
            tool["parameters"] = _json(tool.get("parameters", "{}"), "llm.request.functions")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise Unrecoverable(BAD_MESSAGES, "gen_ai.tool.definitions is not a list of tools")
    # GenAI writes a function's fields at the top level; OpenAI (and the engine) nest them
    return [t if "function" in t else {"type": "function", "function": {
        k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}}
        for t in tools] or None


def _response(span: dict, attrs: dict) -> tuple[dict, str | None]:
    llm = span["llm"]
    raw = attrs.get("gen_ai.output.messages")
    if raw:
        outputs = _json(raw, "gen_ai.output.messages")
        if not isinstance(outputs, list) or not outputs or not isinstance(outputs[0], dict):
            raise Unrecoverable(BAD_MESSAGES, "gen_ai.output.messages holds no message")
        [response] = _from_parts({**outputs[0], "role": "assistant"}, "gen_ai.output.messages[0]")
        return response, llm.get("finish_reason") or outputs[0].get("finish_reason")
    legacy = _indexed({k: v for k, v in attrs.items() if k.startswith("gen_ai.completion.")},
                      "gen_ai.completion")
    if legacy and ("content" in legacy[0] or "tool_calls.0.name" in legacy[0]):
        response = _from_flat({"role": "assistant", "content": legacy[0].get("content")} |
                              {k: v for k, v in legacy[0].items() if k.startswith("tool_calls.")})
        return response, llm.get("finish_reason") or legacy[0].get("finish_reason")
    if llm.get("response_text"):
        return {"role": "assistant", "content": llm["response_text"]}, llm.get("finish_reason")
    raise Unrecoverable(NO_RESPONSE, "the span records no response text or tool calls (was "
                        "message content captured? OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_"
                        "CONTENT=true)")


def recorded_call(span: dict) -> RecordedCall:
    attrs = span.get("attributes") or {}
    raw = span["llm"].get("request_messages") or ""
    if raw.strip() in ("", "[]", "null"):
        raise Unrecoverable(NO_MESSAGES, "the span records no request messages (was message "
                            "content captured? OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_"
                            "CONTENT=true)")
    messages = _messages(raw, "request messages")
    if not any(m["role"] == "system" for m in messages):
        messages = _system(attrs) + messages
    response, finish = _response(span, attrs)
    return RecordedCall(messages, _tools(attrs), response, ended=finish not in CUT_OFF)
