"""Once the upstream has answered, the agent gets the answer and the call gets its span: a
publisher that refuses the span for now (busy) or for good (not encodable), an upstream
killed mid-stream, a client that goes away mid-stream. Real gateway, real broker, the fixed
upstream in its own process where the test kills it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import httpx
import openai
import pytest

from infra import processes
from infra.services import ROOT
from testkit.producers import consume

AUTH = {"Authorization": "Bearer key-1"}


def _span_of(settings, pub, rollout_id: str) -> dict:
    assert pub.flush(20) == 0
    found = [span for _key, span in consume(settings.kafka.bootstrap_servers,
                                            settings.topics.spans, 1, settle_s=0.5)
             if span["rollout_id"] == rollout_id]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.faults
def test_publisher_refusing_after_the_upstream_answered_is_not_a_500(gateway):
    """The publisher is busy (its lock held past max_block_ms, as a stalled spool write holds
    it): the agent still gets its answer, streamed or not, and the spans are published, in
    order, once the publisher takes them again."""
    url, settings, pub = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="key-1", max_retries=0,
                           default_headers={"X-Rollout-Id": "ro-busy"})
    msgs = [{"role": "user", "content": "hi"}]
    release = threading.Event()
    held = threading.Thread(target=lambda: (pub._lock.acquire(), release.wait(30),
                                            pub._lock.release()))
    held.start()
    try:
        time.sleep(0.1)
        answer = client.chat.completions.create(model="fixed-model", messages=msgs)
        assert answer.choices[0].message.content == "Hello from the fixed upstream."
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions
                           .create(model="fixed-model", messages=msgs, stream=True) if c.choices)
        assert streamed == "Hello from the fixed upstream."
        state = httpx.get(url + "/state").json()
        assert state["held_spans"] == 2
        metrics = httpx.get(url + "/metrics").text
        assert "tracetrain_gateway_held_records_total 2.0" in metrics
        assert "tracetrain_gateway_waiting_records 2.0" in metrics
    finally:
        release.set()
        held.join()
    deadline = time.monotonic() + 20
    while httpx.get(url + "/state").json()["held_spans"]:
        assert time.monotonic() < deadline, "the held spans were never published"
        time.sleep(0.1)
    assert pub.flush(20) == 0
    spans = [s for _k, s in consume(settings.kafka.bootstrap_servers, settings.topics.spans, 2,
                                    settle_s=0.5)]
    assert [(s["status"], s["attributes"]["stream"]) for s in spans] == \
        [("ok", "false"), ("ok", "true")]
    assert all(s["llm"]["response_text"] == "Hello from the fixed upstream." for s in spans)


@pytest.mark.faults
def test_held_spans_at_the_bound_make_new_calls_wait_with_503(make_gateway):
    url, settings, pub = make_gateway(held_spans_max=1)
    body = {"model": "fixed-model", "messages": [{"role": "user", "content": "hi"}]}
    pub._lock.acquire()  # the publisher is stuck
    try:
        first = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH)
        assert first.status_code == 200  # answered; its span is held
        second = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH)
        assert second.status_code == 503 and second.headers["retry-after"] == "1"
        assert "1 spans wait for the publisher" in second.text
    finally:
        pub._lock.release()
    deadline = time.monotonic() + 20
    while httpx.get(url + "/state").json()["held_spans"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH).status_code == 200


def test_an_answer_that_cannot_be_encoded_is_recorded_as_an_error_span(gateway):
    """The upstream's text holds a lone surrogate: valid JSON, no valid UTF-8. The agent gets
    the answer; the span stands in as an error saying why its text is missing."""
    url, settings, pub = gateway
    resp = httpx.post(url + "/v1/chat/completions", headers={**AUTH, "X-Rollout-Id": "ro-sur"},
                      json={"model": "lone-surrogate",
                            "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "Broken emoji: \ud83d"
    span = _span_of(settings, pub, "ro-sur")
    assert span["status"] == "error" and span["attributes"]["gateway.replaced"] == "true"
    assert "could not be published as it was" in span["error_message"]
    assert "invalid_record" in span["error_message"]
    assert span["attributes"]["http.status_code"] == "200"


@pytest.fixture
def upstream_process(tmp_path):
    """The fixed upstream in a process of its own, so that a test can kill it."""
    port = processes.free_port()
    record = processes.spawn(tmp_path, "fixed-upstream",
                             [sys.executable, "-m", "testkit.fixed_upstream", str(port)],
                             address=f"127.0.0.1:{port}", cwd=ROOT)
    processes.wait_until(lambda: processes.port_in_use("127.0.0.1", port), 30,
                         "fixed upstream", log=record.log)
    yield record, f"http://127.0.0.1:{port}"
    processes.stop(tmp_path, "fixed-upstream", timeout_s=5)


@pytest.mark.faults
def test_upstream_killed_mid_stream_is_an_error_span_and_an_error_event(make_gateway,
                                                                        upstream_process):
    record, upstream_url = upstream_process
    url, settings, pub = make_gateway(upstream_url=upstream_url + "/v1")
    client = openai.OpenAI(base_url=url + "/v1", api_key="key-1", max_retries=0,
                           default_headers={"X-Rollout-Id": "ro-killed"})
    stream = client.chat.completions.create(
        model="slow-stream", messages=[{"role": "user", "content": "hi"}], stream=True)
    first = next(iter(stream))
    assert first.choices[0].delta.content == "Hello"
    os.kill(record.pid, signal.SIGKILL)  # the engine dies mid-answer
    with pytest.raises(openai.APIError, match="broke off the stream"):
        for _ in stream:
            pass
    span = _span_of(settings, pub, "ro-killed")
    assert span["status"] == "error" and "broke off the stream" in span["error_message"]
    assert span["llm"]["response_text"] == "Hello"  # what came before the break
    assert "tracetrain_gateway_handled_calls_total{route=\"chat\",status=\"broken\"} 1.0" in \
        httpx.get(url + "/metrics").text


@pytest.mark.faults
def test_client_gone_mid_stream_still_gets_its_span_cancelled(gateway):
    url, settings, pub = gateway
    body = {"model": "slow-stream", "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                      headers={**AUTH, "X-Rollout-Id": "ro-gone"}) as resp:
        first = next(resp.iter_raw())
        assert b"Hello" in first
    # the connection is closed; the upstream still has a minute of stream to go
    span = _span_of(settings, pub, "ro-gone")
    assert span["status"] == "cancelled"
    assert "the client went away before the stream ended" in span["error_message"]
    assert span["llm"]["response_text"] == "Hello"
    assert "tracetrain_gateway_handled_calls_total{route=\"chat\",status=\"cancelled\"} 1.0" in \
        httpx.get(url + "/metrics").text


@pytest.mark.faults
def test_client_leaving_on_done_before_the_upstream_ends_is_ok_not_cancelled(gateway):
    """The client reads the stream to `[DONE]` and closes while the upstream still holds its
    connection open: the client had the whole answer, so the span is ok (seen as a flaky
    `cancelled` when a client closed before the relay saw the upstream end)."""
    url, settings, pub = gateway
    body = {"model": "lingering-stream", "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                      headers={**AUTH, "X-Rollout-Id": "ro-done"}) as resp:
        for line in resp.iter_lines():
            if line == "data: [DONE]":
                break
        else:
            pytest.fail("the gateway never relayed [DONE]")
    span = _span_of(settings, pub, "ro-done")
    assert span["status"] == "ok", span["error_message"]
    assert span["llm"]["response_text"] == "Hello from the fixed upstream."
