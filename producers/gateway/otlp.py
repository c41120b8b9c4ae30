"""The OTLP/HTTP trace receiver on the gateway: `POST /v1/traces`, protobuf or JSON.

Any OTel SDK (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://gateway/v1/traces`, with
`OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<key>` when the gateway has keys) or an OTel
Collector can export to it. Each span is mapped by `producers.otel.to_span`, its ids checked
as the gateway checks id headers, and recorded; the reply is an ExportTraceServiceResponse in
the request's encoding. Spans with a bad id (a rollout id of 64 KB, a task id that is a
number) are rejected and counted in its `partial_success`, with the first reason; the others
are published. A request whose every span is rejected is a 400. In OTLP/JSON, trace and span
ids are hex strings and 64-bit integers may be strings (OTLP spec).
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.responses import Response
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from producers.gateway.guard import check_auth, parse_json, read_body
from producers.gateway.ids import BadIdHeader, check_span_ids
from producers.otel import OtelSpan, to_span
from tracetrain.errors import BadRequest

_STATUS = {0: "unset", 1: "ok", 2: "error"}
_KIND = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _pb_value(v):
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_pb_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which) if which else None


def _from_protobuf(body: bytes) -> list[OtelSpan]:
    try:
        req = ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise BadRequest(f"body is not an OTLP ExportTraceServiceRequest protobuf: {exc}") from exc
    out = []
    for rs in req.resource_spans:
        res = {kv.key: _pb_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append(OtelSpan(
                    name=sp.name, trace_id=sp.trace_id.hex(), span_id=sp.span_id.hex(),
                    parent_id=sp.parent_span_id.hex() or None,
                    start_ns=sp.start_time_unix_nano, end_ns=sp.end_time_unix_nano,
                    status=_STATUS.get(sp.status.code, "unset"),
                    status_message=sp.status.message or None,
                    attributes={kv.key: _pb_value(kv.value) for kv in sp.attributes},
                    resource=res, kind=_KIND.get(sp.kind, "internal")))
    return out


def _json_value(v: dict):
    if not isinstance(v, dict):
        return v
    for key in ("stringValue", "boolValue", "doubleValue", "bytesValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_json_value(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return {kv["key"]: _json_value(kv.get("value", {})) for kv in v["kvlistValue"].get("values", [])}
    return None


def _attrs(items) -> dict:
    return {kv["key"]: _json_value(kv.get("value", {})) for kv in items or []}


def _from_json(req) -> list[OtelSpan]:
    try:
        out = []
        for rs in req.get("resourceSpans", []):
            res = _attrs((rs.get("resource") or {}).get("attributes"))
            for ss in rs.get("scopeSpans", []):
                for sp in ss.get("spans", []):
                    status = sp.get("status") or {}
                    out.append(OtelSpan(
                        name=sp.get("name", ""), trace_id=sp["traceId"].lower(),
                        span_id=sp["spanId"].lower(), parent_id=(sp.get("parentSpanId") or "").lower() or None,
                        start_ns=int(sp.get("startTimeUnixNano", 0)),
                        end_ns=int(sp.get("endTimeUnixNano", 0)),
                        status=_STATUS.get(int(status.get("code", 0)), "unset"),
                        status_message=status.get("message") or None,
                        attributes=_attrs(sp.get("attributes")), resource=res,
                        kind=_KIND.get(int(sp.get("kind", 1)), "internal")))
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadRequest(f"body is not OTLP/JSON ExportTraceServiceRequest: {exc!r} "
                         "(expected resourceSpans[].scopeSpans[].spans[] with hex "
                         "traceId/spanId)") from exc


def _checked_spans(otel_spans: list[OtelSpan]) -> tuple[list[dict], list[str]]:
    """Our Spans of the request whose ids are ids, and the reasons for the others."""
    spans, rejected = [], []
    for o in otel_spans:
        span = to_span(o)
        try:
            check_span_ids(span, f"span {o.span_id[:32]!r}:")
        except BadIdHeader as exc:
            rejected.append(str(exc))
            continue
        spans.append(span)
    return spans, rejected


def _reply(protobuf: bool, rejected: list[str]) -> Response:
    message = f"{rejected[0]} ({len(rejected)} span(s) rejected)" if rejected else ""
    if protobuf:
        reply = ExportTraceServiceResponse()
        if rejected:
            reply.partial_success.CopyFrom(ExportTracePartialSuccess(
                rejected_spans=len(rejected), error_message=message))
        return Response(reply.SerializeToString(), media_type="application/x-protobuf")
    body = {"partialSuccess": {"rejectedSpans": str(len(rejected)), "errorMessage": message}} \
        if rejected else {}
    return Response(json.dumps(body).encode(), media_type="application/json")


def add_otlp_routes(app: FastAPI, state: dict, keys: list[bytes], limit: int,
                    max_depth: int) -> None:
    @app.post("/v1/traces")
    async def traces(request: Request):
        check_auth(request, keys)
        ctype = request.headers.get("content-type", "").split(";")[0].strip()
        if ctype not in ("application/x-protobuf", "application/json"):
            raise BadRequest(f"content-type {ctype!r}: expected application/x-protobuf "
                             "or application/json (OTLP/HTTP)", status=415)
        state["recorder"].check_room()
        # No upstream to protect here: a spool or disk with no room at all is a 503 the
        # exporter retries, not spans held in memory. (Each span is checked as it is published.)
        pub = state["pub"]
        pub.admit(pub.topics.spans, 0)
        body = await read_body(request, limit)
        protobuf = ctype == "application/x-protobuf"
        otel_spans = _from_protobuf(body) if protobuf else _from_json(parse_json(body, max_depth))
        spans, rejected = _checked_spans(otel_spans)
        if rejected and not spans:
            raise BadRequest(f"every span of the request was rejected: {rejected[0]}")
        for span in spans:
            state["recorder"].record(span)
        return _reply(protobuf, rejected)
