"""The gateway's doors as an attacker tries them: keys on every route (and required beyond
loopback), non-ASCII tokens, chunked bodies past the limit, JSON nested without end, OTLP ids
that are not ids. Against a real gateway (uvicorn) publishing to the real broker."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from producers.gateway.app import create_app
from testkit.producers import consume
from tracetrain.errors import ConfigError
from tracetrain.settings import load_settings

TRACETRAIN = str(Path(sys.executable).with_name("tracetrain"))
AUTH = {"Authorization": "Bearer key-1"}
CHAT = {"model": "fixed-model", "messages": [{"role": "user", "content": "hi"}]}
LIMIT = 64 * 1024  # the gateway fixture's max_body_bytes


def _otlp_json(*spans: dict) -> dict:
    return {"resourceSpans": [{"resource": {"attributes": []},
                               "scopeSpans": [{"spans": list(spans)}]}]}


def _otlp_span(span_id: str, rollout_id: str) -> dict:
    return {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": span_id, "name": "step",
            "startTimeUnixNano": "1", "endTimeUnixNano": "2",
            "attributes": [{"key": "tracetrain.rollout_id",
                            "value": {"stringValue": rollout_id}}]}


# -- keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.internal"])
def test_keys_are_required_beyond_loopback(host):
    with pytest.raises(ConfigError) as info:
        load_settings(gateway={"host": host})
    assert "TRACETRAIN_GATEWAY__API_KEYS" in str(info.value) and repr(host) in str(info.value)
    # Settings built in code skip validation (model_copy); the app refuses them all the same.
    loopback = load_settings()
    exposed = loopback.model_copy(update={"gateway": loopback.gateway.model_copy(
        update={"host": host})})
    with pytest.raises(ConfigError, match="gateway.api_keys is empty"):
        create_app(exposed)


def test_keys_beyond_loopback_when_given_or_switched_off():
    assert load_settings(gateway={"host": "0.0.0.0", "api_keys": ["k"]}).gateway.keys_required()
    assert not load_settings(gateway={"host": "0.0.0.0", "auth": "off"}).gateway.keys_required()
    assert not load_settings(gateway={"host": "127.0.0.1"}).gateway.keys_required()
    assert not load_settings(gateway={"host": "::1"}).gateway.keys_required()
    with pytest.raises(ConfigError, match="gateway.auth is 'on'"):
        load_settings(gateway={"auth": "on"})


def test_gateway_command_beyond_loopback_without_keys_refuses_to_start(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "TRACETRAIN_HOME": str(tmp_path),
           "TRACETRAIN_CONFIG": "/nonexistent.toml", "TRACETRAIN_GATEWAY__HOST": "0.0.0.0"}
    result = subprocess.run([TRACETRAIN, "gateway"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "'0.0.0.0' is not a loopback address" in result.stderr
    assert "TRACETRAIN_GATEWAY__API_KEYS" in result.stderr


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/v1/chat/completions", CHAT),
    ("GET", "/v1/models", None),
    ("POST", "/v1/rewards", {"rollout_id": "ro-1", "value": 1.0}),
    ("POST", "/v1/traces", _otlp_json(_otlp_span("00f067aa0ba902b7", "ro-1"))),
])
def test_every_route_needs_a_key_and_a_non_ascii_token_is_a_401(gateway, method, path, body):
    url, settings, pub = gateway
    for headers in ({}, {"Authorization": "Bearer wrong"},
                    {"Authorization": "Bearer clé".encode()},  # UTF-8 on the wire
                    {"Authorization": "Bearer ключ".encode()}):
        resp = httpx.request(method, url + path, json=body, headers=headers)
        assert resp.status_code == 401, (headers, resp.status_code, resp.text)
        assert "missing or wrong API key" in resp.text
    assert httpx.request(method, url + path, json=body, headers=AUTH).status_code < 300
    assert pub.flush(20) == 0


# -- body size and depth --------------------------------------------------------------------


def _chunked_without_end(url: str, path: str, ctype: str, size: int) -> bytes:
    """Send `size` bytes as chunks and never the last chunk; what the server answers in 10 s.
    A server that reads the whole body before looking at its size never answers."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer key-1\r\n"
                      f"Content-Type: {ctype}\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
        piece = b"[" * 8192
        for _ in range(size // len(piece)):
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        try:
            return sock.recv(4096)
        except TimeoutError:
            return b""


@pytest.mark.parametrize("path, ctype", [("/v1/chat/completions", "application/json"),
                                         ("/v1/rewards", "application/json"),
                                         ("/v1/traces", "application/json"),
                                         ("/v1/traces", "application/x-protobuf")])
def test_chunked_body_past_the_limit_is_refused_while_reading(gateway, path, ctype):
    url, _settings, _pub = gateway
    answer = _chunked_without_end(url, path, ctype, 2 * LIMIT)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert f"exceeds the limit of {LIMIT} bytes".encode() in answer


def _nested(depth: int) -> str:
    return "[" * depth + '"x"' + "]" * depth


# 65: one level past the bound; 30,000: past the JSON parser's own recursion limit (a 500
# once), within the 64 KiB body limit.
@pytest.mark.parametrize("depth", [65, 30_000])
def test_json_nested_deeper_than_the_bound_is_a_400(gateway, depth):
    url, settings, pub = gateway
    deep = _nested(depth)
    bodies = {
        "/v1/chat/completions": '{"model": "fixed-model", "messages": [{"role": "user", '
                                f'"content": {deep}}}]}}',
        "/v1/rewards": f'{{"rollout_id": "ro-1", "value": 1.0, "name": {deep}}}',
        "/v1/traces": f'{{"resourceSpans": [{{"scopeSpans": [{{"spans": [], "x": {deep}}}]}}]}}',
    }
    for path, text in bodies.items():
        assert len(text) < LIMIT
        resp = httpx.post(url + path, content=text.encode(),
                          headers={**AUTH, "Content-Type": "application/json"})
        assert resp.status_code == 400, (path, resp.status_code, resp.text[:300])
        assert "nests objects and arrays more than 64 levels deep" in resp.text, resp.text
    # 64 levels of nesting pass (the chat body adds three of its own)
    ok = dict(CHAT, messages=[{"role": "user", "content": json.loads(_nested(61))}])
    assert httpx.post(url + "/v1/chat/completions", json=ok, headers=AUTH).status_code == 200
    assert pub.flush(20) == 0


# -- OTLP ids -------------------------------------------------------------------------------


def test_otlp_spans_with_bad_ids_are_rejected_and_the_rest_published(make_gateway):
    url, settings, pub = make_gateway(max_body_bytes=1024 * 1024)
    huge = "r" * 65536  # once a struct.error in the spool: 500 for the whole batch
    good = _otlp_span("00f067aa0ba902b7", "ro-otlp-good")
    bad = _otlp_span("00f067aa0ba902b8", huge)
    resp = httpx.post(url + "/v1/traces", json=_otlp_json(good, bad), headers=AUTH)
    assert resp.status_code == 200, resp.text
    partial = resp.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "rollout_id 'rrrrrrrrrr" in partial["errorMessage"]
    assert "is not a valid id" in partial["errorMessage"]
    # Protobuf: a task id that is a number, and a rollout id with a slash.
    spans = []
    for i, (key, value) in enumerate((("tracetrain.task_id", AnyValue(int_value=7)),
                                      ("tracetrain.rollout_id", AnyValue(string_value="a/b")))):
        spans.append(PbSpan(trace_id=bytes(16), span_id=bytes([1] * 7 + [i]), name="x",
                            attributes=[KeyValue(key=key, value=value)]))
    req = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])])
    resp = httpx.post(url + "/v1/traces", content=req.SerializeToString(),
                      headers={**AUTH, "Content-Type": "application/x-protobuf"})
    assert resp.status_code == 400 and "every span of the request was rejected" in resp.text
    assert "task_id 7 is not a valid id" in resp.text
    # all rejected, JSON too
    resp = httpx.post(url + "/v1/traces", json=_otlp_json(bad), headers=AUTH)
    assert resp.status_code == 400 and "is not a valid id" in resp.text
    # only the good span reached Kafka
    assert pub.flush(20) == 0
    found = consume(settings.kafka.bootstrap_servers, settings.topics.spans, 1, settle_s=1.0)
    assert [span["rollout_id"] for _key, span in found] == ["ro-otlp-good"]


def test_reward_ids_are_checked_like_header_ids(gateway):
    url, _settings, pub = gateway
    for field in ("rollout_id", "span_id", "task_id", "agent_name"):
        for value in ("x" * 1000, "bad id/with spaces"):
            resp = httpx.post(url + "/v1/rewards", headers=AUTH,
                              json={"rollout_id": "ro-1", "value": 1.0, field: value})
            assert resp.status_code == 422, resp.text
            assert f"'{field}'" in resp.text and "should match pattern" in resp.text
    assert pub.pending() == 0 and pub.counts["sent"] == 0  # nothing was published


def test_a_temperature_past_a_floats_range_is_recorded_not_a_500(gateway):
    """`float(10**400)` overflows: the span's temperature attribute raised in the recording
    that must never raise, so the agent got a 500 and the call no span."""
    url, settings, pub = gateway
    body = json.dumps({**CHAT, "temperature": 10**400})
    resp = httpx.post(url + "/v1/chat/completions", content=body,
                      headers={**AUTH, "Content-Type": "application/json",
                               "X-Rollout-Id": "ro-huge-t"})
    assert resp.status_code == 200, resp.text  # the fixed upstream takes any temperature
    assert pub.flush(20) == 0
    spans = [s for _k, s in consume(settings.kafka.bootstrap_servers, settings.topics.spans, 1,
                                    settle_s=0.5) if s["rollout_id"] == "ro-huge-t"]
    assert len(spans) == 1 and "gen_ai.request.temperature" not in spans[0]["attributes"]
