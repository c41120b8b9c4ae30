"""OpenTelemetry GenAI spans as instrumentations write them, for the re-tokenisation tests: the
attributes of one chat call (messages of typed parts, as opentelemetry-instrumentation-openai
0.62 and -openai-v2 record them with content capture on), and an OTLP/JSON export request
holding such spans, the body an OTLP exporter posts to the gateway's /v1/traces.
"""

from __future__ import annotations

import json


def _parts(message: dict) -> dict:
    """An OpenAI message as a GenAI message of parts."""
    if message["role"] == "tool":
        return {"role": "tool", "parts": [{"type": "tool_call_response",
                                           "id": message.get("tool_call_id"),
                                           "response": message["content"]}]}
    parts = [{"type": "text", "content": message["content"]}] if message.get("content") else []
    parts += [{"type": "tool_call", "id": c["id"], "name": c["function"]["name"],
               "arguments": json.loads(c["function"]["arguments"])}
              for c in message.get("tool_calls") or []]
    return {"role": message["role"], "parts": parts}


def chat_attributes(messages: list[dict], response: dict, finish: str = "stop",
                    tools: list[dict] | None = None, model: str = "policy",
                    **extra) -> dict:
    """A chat span's attributes: OpenAI `messages` and `response` (an assistant message) as
    gen_ai.input.messages / gen_ai.output.messages, `tools` as gen_ai.tool.definitions."""
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
             "gen_ai.request.model": model, "gen_ai.response.model": model,
             "gen_ai.input.messages": json.dumps([_parts(m) for m in messages]),
             "gen_ai.output.messages": json.dumps([{**_parts(response),
                                                    "finish_reason": finish}]),
             "gen_ai.response.finish_reasons": [finish], **extra}
    if tools:
        attrs["gen_ai.tool.definitions"] = json.dumps([{"type": "function", **t["function"]}
                                                       for t in tools])
    return attrs


def _value(value) -> dict:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": value}


def otlp_request(spans: list[dict], trace_id: str, resource: dict | None = None) -> dict:
    """An OTLP/JSON ExportTraceServiceRequest; each of `spans` is {"span_id", "name",
    "start_ns", "attributes"} (and optionally "parent_id", "status")."""
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": k, "value": _value(v)}
                                    for k, v in (resource or {}).items()]},
        "scopeSpans": [{"spans": [{
            "traceId": trace_id, "spanId": s["span_id"], "parentSpanId": s.get("parent_id", ""),
            "name": s["name"], "kind": 3, "startTimeUnixNano": str(s["start_ns"]),
            "endTimeUnixNano": str(s["start_ns"] + 1000),
            "status": {"code": 2 if s.get("status") == "error" else 1},
            "attributes": [{"key": k, "value": _value(v)} for k, v in s["attributes"].items()],
        } for s in spans]}]}]}
