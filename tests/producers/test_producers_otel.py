"""OpenTelemetry in: the OTel SDK with opentelemetry-instrumentation-openai, exporting both
through our SpanExporter and through OTLP/HTTP (protobuf) to the gateway's /v1/traces; the
same spans arrive by both paths. Also OTLP/JSON, and spans without GenAI attributes."""

from __future__ import annotations

import json
from collections import defaultdict

import httpx
import openai
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from producers.otel import TracetrainSpanExporter
from testkit.producers import consume

pytestmark = pytest.mark.integration


def test_instrumented_openai_spans_arrive_identically_by_exporter_and_otlp(gateway, upstream):
    url, settings, pub = gateway
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-agent",
                                                        "tracetrain.rollout_id": "ro-otel"}))
    provider.add_span_processor(SimpleSpanProcessor(TracetrainSpanExporter(pub)))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
        endpoint=url + "/v1/traces", headers={"Authorization": "Bearer key-1"})))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        # The client calls the upstream directly: here OTel, not the gateway, records the call.
        client = openai.OpenAI(base_url=upstream.url + "/v1", api_key="x", max_retries=0)
        tracer = provider.get_tracer("test")
        with tracer.start_as_current_span("agent-step"):
            client.chat.completions.create(model="fixed-model",
                                           messages=[{"role": "user", "content": "Say hello"}])
            with tracer.start_as_current_span("execute_tool add") as tool:
                tool.set_attribute("gen_ai.operation.name", "execute_tool")
                tool.set_attribute("gen_ai.tool.name", "add")
                tool.set_attribute("gen_ai.tool.call.arguments", '{"a": 2, "b": 3}')
                tool.set_attribute("gen_ai.tool.call.result", "5")
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    spans = [s for _k, s in consume(settings.kafka.bootstrap_servers, settings.topics.spans, 6,
                                    settle_s=1.0)]
    copies = defaultdict(list)
    for s in spans:
        copies[s["span_id"]].append(s)
    assert len(copies) == 3 and all(len(c) == 2 for c in copies.values()), \
        {k: len(v) for k, v in copies.items()}
    for exported, received in copies.values():
        assert exported == received
    by_kind = {c[0]["kind"]: c[0] for c in copies.values()}
    assert set(by_kind) == {"llm", "tool", "other"}
    llm = by_kind["llm"]
    assert llm["rollout_id"] == "ro-otel" and llm["resource"]["service"] == "otel-agent"
    assert llm["llm"]["model"] == "fixed-model"
    assert llm["llm"]["response_text"] == "Hello from the fixed upstream."
    assert "Say hello" in llm["llm"]["request_messages"]
    assert llm["llm"]["usage"] == {"prompt_tokens": 5, "completion_tokens": 5}
    assert llm["parent_id"] == by_kind["other"]["span_id"]
    tool = by_kind["tool"]["tool"]
    assert tool == {"name": "add", "arguments": '{"a": 2, "b": 3}', "result": "5", "ok": True}
    assert by_kind["other"]["attributes"]["otel.name"] == "agent-step"


def test_otlp_json_and_bad_bodies(gateway):
    url, settings, pub = gateway
    auth = {"Authorization": "Bearer key-1"}
    body = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "svc"}}]}, "scopeSpans": [{"spans": [{
            "traceId": "5B8EFFF798038103D269B633813FC60C", "spanId": "EEE19B7EC3C1B174",
            "name": "chat m", "kind": 3, "startTimeUnixNano": "1000", "endTimeUnixNano": "2000",
            "status": {"code": 2, "message": "boom"},
            "attributes": [{"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
                           {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "3"}}]}]}]}]}
    resp = httpx.post(url + "/v1/traces", json=body, headers=auth)
    assert resp.status_code == 200, resp.text
    assert httpx.post(url + "/v1/traces", content=b"\xff\x00junk", headers={
        **auth, "Content-Type": "application/x-protobuf"}).status_code == 400
    assert httpx.post(url + "/v1/traces", json={"resourceSpans": [{"scopeSpans": [
        {"spans": [{"name": "no ids"}]}]}]}, headers=auth).status_code == 400
    assert httpx.post(url + "/v1/traces", content=b"x", headers={
        **auth, "Content-Type": "text/plain"}).status_code == 415
    assert pub.flush(20) == 0
    [(key, span)] = consume(settings.kafka.bootstrap_servers, settings.topics.spans, 1,
                            settle_s=0.5)
    assert key == span["rollout_id"] == "otel-5b8efff798038103d269b633813fc60c"
    assert span["kind"] == "llm" and span["status"] == "error" and span["error_message"] == "boom"
    assert span["llm"]["usage"] == {"prompt_tokens": 3, "completion_tokens": 0}
    assert (span["start_time_ns"], span["end_time_ns"]) == (1000, 2000)
    assert json.loads(span["attributes"]["gen_ai.usage.input_tokens"]) == 3
