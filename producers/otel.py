"""OpenTelemetry into tracetrain: a SpanExporter for the OTel SDK, and the one mapping from an
OTel span to our Span that the exporter and the gateway's OTLP receiver (`/v1/traces`) share.

    provider.add_span_processor(BatchSpanProcessor(TracetrainSpanExporter(publisher)))

Mapping: spans with GenAI semantic-convention attributes (`gen_ai.*`, as written by
opentelemetry-instrumentation-openai and others: `gen_ai.input.messages` /
`gen_ai.output.messages`, or the older `gen_ai.prompt.N.*` / `gen_ai.completion.N.*`) become
`llm` spans; `gen_ai.operation.name = execute_tool` (or `gen_ai.tool.name`, or
`traceloop.span.kind = tool`) become `tool` spans; every other span is kept as kind `other`.
The rollout id is the `tracetrain.rollout_id` attribute (span, then resource), else
`otel-<trace id>`: one trace is one rollout. All attributes are kept as strings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode

from producers.publisher import Publisher
from producers.records import llm_part, new_span, tool_part
from tracetrain.errors import TracetrainError


@dataclass
class OtelSpan:
    """An OTel span reduced to what the mapping reads (from the SDK or from OTLP)."""

    name: str
    trace_id: str  # hex
    span_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int
    status: str  # ok | error | unset
    status_message: str | None = None
    attributes: dict = field(default_factory=dict)
    resource: dict = field(default_factory=dict)
    kind: str = "internal"


def _s(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value, default=str)


def _int(value) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _indexed(attrs: dict, prefix: str) -> list[dict]:
    """`gen_ai.prompt.0.role`, `gen_ai.prompt.0.content`, ... -> [{"role":..., "content":...}]"""
    items: dict[int, dict] = {}
    for key, value in attrs.items():
        if key.startswith(prefix + "."):
            idx, _, rest = key[len(prefix) + 1:].partition(".")
            if idx.isdigit() and rest:
                items.setdefault(int(idx), {})[rest] = value
    return [items[i] for i in sorted(items)]


def _output_text(attrs: dict) -> tuple[str, str | None]:
    raw = attrs.get("gen_ai.output.messages")
    if raw:
        try:
            messages = json.loads(raw) if isinstance(raw, str) else raw
            first = messages[0] if messages else {}
            text = "".join(p.get("content") or "" for p in first.get("parts", [])
                           if p.get("type") == "text")
            return text, first.get("finish_reason") or None
        except (ValueError, TypeError, AttributeError, IndexError, KeyError):
            return _s(raw), None
    completions = _indexed(attrs, "gen_ai.completion")
    if completions:
        return _s(completions[0].get("content", "")), completions[0].get("finish_reason")
    return "", None


def _kind(attrs: dict) -> str:
    op = attrs.get("gen_ai.operation.name")
    if op == "execute_tool" or "gen_ai.tool.name" in attrs or attrs.get("traceloop.span.kind") == "tool":
        return "tool"
    if any(k.startswith(("gen_ai.request.", "gen_ai.response.", "gen_ai.input.", "gen_ai.prompt"))
           for k in attrs) or op in ("chat", "text_completion", "generate_content"):
        return "llm"
    if op in ("invoke_agent", "create_agent"):
        return "agent"
    return "other"


def to_span(o: OtelSpan) -> dict:
    """Our Span record for one OTel span."""
    attrs, res = o.attributes, o.resource

    def ours(name: str):
        return attrs.get(f"tracetrain.{name}") or res.get(f"tracetrain.{name}")

    kind = _kind(attrs)
    llm = tool = None
    if kind == "llm":
        messages = attrs.get("gen_ai.input.messages")
        if messages is None:
            messages = json.dumps(_indexed(attrs, "gen_ai.prompt"))
        text, finish = _output_text(attrs)
        reasons = attrs.get("gen_ai.response.finish_reasons")
        if finish is None and reasons:
            finish = reasons[0] if isinstance(reasons, list | tuple) else str(reasons)
        llm = llm_part(
            model=_s(attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model") or ""),
            policy_version=_int(ours("policy_version")),
            request_messages=_s(messages), response_text=text, finish_reason=finish,
            prompt_tokens=_int(attrs.get("gen_ai.usage.input_tokens",
                                         attrs.get("gen_ai.usage.prompt_tokens"))),
            completion_tokens=_int(attrs.get("gen_ai.usage.output_tokens",
                                             attrs.get("gen_ai.usage.completion_tokens"))))
    elif kind == "tool":
        result = attrs.get("gen_ai.tool.call.result", attrs.get("traceloop.entity.output"))
        tool = tool_part(
            _s(attrs.get("gen_ai.tool.name") or attrs.get("traceloop.entity.name") or o.name),
            _s(attrs.get("gen_ai.tool.call.arguments", attrs.get("traceloop.entity.input", "{}"))),
            None if result is None else _s(result), ok=o.status != "error")
    kept = {k: _s(v) for k, v in attrs.items()}
    kept.update({"otel.name": o.name, "otel.kind": o.kind})
    return new_span(
        kind, _s(ours("rollout_id") or f"otel-{o.trace_id}"), trace_id=o.trace_id,
        span_id=o.span_id, parent_id=o.parent_id, attempt_id=ours("attempt_id"),
        task_id=ours("task_id"),
        agent_name=_s(ours("agent_name") or attrs.get("gen_ai.agent.name") or ""),
        policy_name=ours("policy_name"), start_time_ns=o.start_ns, end_time_ns=o.end_ns,
        status=o.status, error_message=o.status_message if o.status == "error" else None,
        service=_s(res.get("service.name", "")), attributes=kept, llm=llm, tool=tool)


def from_sdk(span: ReadableSpan) -> OtelSpan:
    ctx, parent = span.context, span.parent
    code = span.status.status_code
    return OtelSpan(
        name=span.name, trace_id=f"{ctx.trace_id:032x}", span_id=f"{ctx.span_id:016x}",
        parent_id=f"{parent.span_id:016x}" if parent else None,
        start_ns=span.start_time or 0, end_ns=span.end_time or span.start_time or 0,
        status={StatusCode.ERROR: "error", StatusCode.OK: "ok"}.get(code, "unset"),
        status_message=span.status.description, attributes=dict(span.attributes or {}),
        resource=dict(span.resource.attributes) if span.resource else {},
        kind=span.kind.name.lower())


class TracetrainSpanExporter(SpanExporter):
    """Publishes every finished OTel span (none dropped) through our publisher."""

    def __init__(self, publisher: Publisher):
        self.publisher = publisher

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            for span in spans:
                self.publisher.publish_span(to_span(from_sdk(span)))
        except TracetrainError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.publisher.flush(timeout_millis / 1000) == 0

    def shutdown(self) -> None:
        """The publisher is shared: its owner closes it."""
