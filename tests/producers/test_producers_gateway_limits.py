"""The gateway refuses what its publisher could not keep, before it calls the upstream: a call
whose span Kafka would refuse gets 413 with the limit; a full spool or a full disk gets 503
with Retry-After. What is accepted is delivered, in order. Real gateway (uvicorn), real
upstream double, real broker; the full disk is a real (small tmpfs) file system."""

from __future__ import annotations

import json
from contextlib import contextmanager

import httpx
import pytest

from infra import processes, topics
from infra.processes import wait_until
from testkit.fixed_upstream import ServerThread, app
from testkit.metrics import metric_samples
from testkit.producers import consume, set_topic_config
from testkit.producers import running_gateway as gateway_before

pytestmark = pytest.mark.integration
EMPTY_CHAT_BYTES = len('[{"role": "user", "content": ""}]')  # the span's messages, no content


class CountingUpstream:
    """The fixed upstream, counting the completion calls that reach it."""

    def __init__(self):
        self.app, self.calls = app(), 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("completions"):
            self.calls += 1
        await self.app(scope, receive, send)


@contextmanager
def running_gateway(settings, spool_dir, **publisher):
    """testkit's gateway in front of a CountingUpstream, with `publisher` settings changed."""
    upstream = CountingUpstream()
    up = ServerThread(upstream, processes.free_port()).start()
    settings = settings.model_copy(update={
        "publisher": settings.publisher.model_copy(update=publisher)})
    try:
        with gateway_before(settings, up.url + "/v1", spool_dir, "gw-limits") as (url, _, pub):
            yield url, pub, upstream
    finally:
        up.stop()


def chat(url: str, content: str, rollout: str = "ro-1") -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=30, headers={"X-Rollout-Id": rollout},
                      json={"model": "fixed-model",
                            "messages": [{"role": "user", "content": content}]})


def test_a_call_whose_span_kafka_would_refuse_gets_413_before_the_upstream(kafka_settings,
                                                                         tmp_path):
    bootstrap, spans_topic = kafka_settings.kafka.bootstrap_servers, kafka_settings.topics.spans
    set_topic_config(bootstrap, spans_topic, "max.message.bytes", "50000")
    limit = 50000 - 61 - 36  # less a batch header and librdkafka's per-record allowance
    with running_gateway(kafka_settings, tmp_path / "spool") as (url, pub, upstream):
        wait_until(lambda: pub.health()["delivery"]["record_limit_bytes"] == limit, 30,
                   "the publisher reading the spans topic's limit")
        refused = chat(url, "x" * 60_000)
        assert refused.status_code == 413, refused.text
        assert str(limit) in refused.json()["error"]["message"]
        assert refused.json()["error"]["limit_bytes"] == limit
        assert upstream.calls == 0, "refused before the upstream was called"
        # Its request fits, the span with the answer does not: the agent gets its answer,
        # the span goes to the spool's dead-letter file, and what follows is delivered.
        near = chat(url, "y" * (limit - 50 - EMPTY_CHAT_BYTES))
        assert near.status_code == 200 and upstream.calls == 1
        assert chat(url, "fits").status_code == 200
        assert pub.flush(30) == 0
        health = httpx.get(url + "/healthz").json()
        assert health["counts"]["dead_lettered"] == 1 and health["spool"]["dead_letters"] == 1
        assert health["ok"] and health["delivery"]["state"] == "running"
    [(key, span)] = consume(bootstrap, spans_topic, 1)
    assert key == "ro-1" and "fits" in span["llm"]["request_messages"]


def test_a_full_spool_answers_503_with_retry_after_until_deliveries_make_room(
        kafka_broker, topic_settings, tmp_path):
    """Spans wait in the spool (the topics are not created yet) until it holds its limit of
    2 MiB; then calls get 503 with Retry-After, without reaching the upstream, and metrics
    and /healthz say why; once the topics exist, deliveries make room and calls go through."""
    from testkit.fixtures.kafka import settings_with

    settings = settings_with(kafka=kafka_broker, topics=topic_settings, home=tmp_path)
    with running_gateway(settings, tmp_path / "spool", spool_segment_mb=1, spool_max_mb=2,
                         spool_full_retry_after_s=1, retry_backoff_ms=200,
                         retry_backoff_max_ms=1000,
                         librdkafka={"topic.metadata.propagation.max.ms": 1000}
                         ) as (url, pub, upstream):
        accepted, refused = [], None
        for i in range(60):
            resp = chat(url, f"{i:03d}" + "z" * 100_000, rollout=f"ro-{i % 5}")
            if resp.status_code == 503:
                refused = resp
                break
            assert resp.status_code == 200, resp.text
            accepted.append(f"{i:03d}")
        assert refused is not None, "a 2 MiB spool should have filled"
        assert refused.headers["retry-after"] == "1"
        assert "spool_max_mb" in refused.json()["error"]["message"]
        reached = upstream.calls
        assert chat(url, "z" * 100_000).status_code == 503 and upstream.calls == reached
        me = {"publisher": "gw-limits"}

        def scrape():
            return metric_samples(httpx.get(url + "/metrics").text)

        # librdkafka calls the topics missing a second after the first span was handed to it
        wait_until(lambda: scrape()["tracetrain_publisher_delivery_state_value",
                                    {**me, "state": "retrying"}] == 1, 30, "state retrying")
        page = scrape()
        assert page["tracetrain_publisher_output_records_total", {**me, "outcome": "refused"}] >= 2
        assert page["tracetrain_publisher_spool_limit_bytes", me] == 2 * 1024 * 1024
        assert page["tracetrain_publisher_delivery_state_value", {**me, "state": "retrying"}] == 1
        health = httpx.get(url + "/healthz").json()
        assert health["spool"]["nearly_full"] and not health["ok"]
        assert health["counts"]["refused"] >= 2

        topics.create_topics(kafka_broker.bootstrap_servers, topic_settings)
        wait_until(lambda: chat(url, "after", rollout="ro-after").status_code == 200, 60,
                   "a call accepted once deliveries made room")
        assert pub.flush(60) == 0
    arrived = consume(kafka_broker.bootstrap_servers, settings.topics.spans, len(accepted) + 1)
    def seq(span: dict) -> str:
        return json.loads(span["llm"]["request_messages"])[0]["content"][:3]

    # The publisher's counts say whether it took every record as delivered (consume logs
    # what each partition holds on the broker). With five requests in flight, about 1 run in
    # 10 had records reported delivered that the broker's log did not hold (producer_config).
    got = sorted(seq(s) for k, s in arrived if k != "ro-after")
    assert got == accepted, (dict(pub.counts), [k for k, _ in arrived])
    assert sum(k == "ro-after" for k, _s in arrived) == 1
    for rollout in {f"ro-{i % 5}" for i in range(len(accepted))}:
        mine = [seq(s) for k, s in arrived if k == rollout]
        assert mine == sorted(mine), f"{rollout} out of order: {mine}"


@pytest.mark.faults
def test_a_full_disk_answers_503_with_retry_after(kafka_settings, tmp_path):
    from testkit.disk import fill, small_filesystem

    with small_filesystem(tmp_path / "disk", size_kb=1024) as disk, \
            running_gateway(kafka_settings, disk / "spool",
                            spool_full_retry_after_s=1) as (url, pub, upstream):
        assert chat(url, "before").status_code == 200
        filler = fill(disk)
        full = chat(url, "while full")
        assert full.status_code == 503, full.text
        assert full.headers["retry-after"] == "1" and "disk is full" in full.text
        assert upstream.calls == 1, "refused before the upstream was called"
        # The OTLP receiver refuses the same way, rather than hold the spans in memory.
        otlp = httpx.post(url + "/v1/traces", json={"resourceSpans": [{"scopeSpans": [{"spans": [
            {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
             "name": "step", "startTimeUnixNano": "1", "endTimeUnixNano": "2"}]}]}]})
        assert otlp.status_code == 503 and otlp.headers["retry-after"] == "1", otlp.text
        assert httpx.get(url + "/state").json()["held_spans"] == 0
        assert httpx.get(url + "/healthz").json()["spool"]["disk_full"]
        filler.unlink()
        wait_until(lambda: chat(url, "after").status_code == 200, 30, "a call once there is room")
        assert pub.flush(30) == 0
    arrived = consume(kafka_settings.kafka.bootstrap_servers, kafka_settings.topics.spans, 2)
    assert [("before" in s["llm"]["request_messages"], "after" in s["llm"]["request_messages"])
            for _k, s in arrived] == [(True, False), (False, True)]
