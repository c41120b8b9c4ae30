"""The publisher when Kafka will not take a record: too large for it, a topic that does not
exist yet, a topic whose limit an operator lowered, a producer librdkafka calls failed, and a
failure of the delivery thread itself. Nothing is lost or reordered, and delivery goes on.
All on the real session broker, read back with a real consumer."""

from __future__ import annotations

import base64
import os
import time

import pytest

from infra import topics
from infra.processes import wait_until
from producers.publisher import Publisher
from producers.records import llm_part, new_reward, new_span
from producers.spool import Spool
from schemas import Codec
from testkit.producers import check_order, consume, set_topic_config
from tracetrain.observability import values

pytestmark = pytest.mark.integration


def span(seq: int, rollouts: int = 10, text: str = "") -> dict:
    return new_span("llm", f"r{seq % rollouts}", attributes={"seq": str(seq)},
                    llm=llm_part("m", response_text=text) if text else None)


def noise(nbytes: int) -> str:
    """Text that lz4 barely compresses: a record this size stays about this size on the wire."""
    return base64.b64encode(os.urandom(nbytes * 3 // 4)).decode()


def with_publisher(settings, **update):
    return settings.model_copy(update={"publisher": settings.publisher.model_copy(update=update)})


def errors_by_name(pub: Publisher) -> dict[str, float]:
    return values(pub._errors, "error")


def test_a_record_too_large_in_spool_mode_is_set_aside_and_delivery_goes_on(kafka_settings,
                                                                            tmp_path):
    """A 1.2 MB span published while the publisher is in spool mode (a small librdkafka
    queue overflowed) goes to the dead-letter file; the spans before and after it arrive."""
    settings = with_publisher(kafka_settings, queue_max_messages=50)
    pub = Publisher(settings, name="big", spool_dir=tmp_path / "spool")
    expected = []
    try:
        for i in range(300):
            pub.publish_span(span(i))
            expected.append(str(i))
        assert pub.counts["spooled"] > 0, "the queue should have overflowed into the spool"
        pub.publish_span(span(300, text=noise(1_200_000)))
        for i in range(301, 600):
            pub.publish_span(span(i))
            expected.append(str(i))
        assert pub.flush(60) == 0
        assert pub.counts["dead_lettered"] == 1 and pub.health()["ok"]
    finally:
        pub.close(10)
    check_order(consume(settings.kafka.bootstrap_servers, settings.topics.spans, 599), expected)
    from producers.dead_letters import read_dead_letters

    [letter] = read_dead_letters(tmp_path / "spool" / "dead-letters.log")
    assert letter.reason.startswith("record_too_large") and "999964" in letter.reason
    assert letter.key == b"r0" and Codec().decode(letter.value, "Span")["attributes"]["seq"] == "300"


def test_a_too_large_record_left_in_the_spool_does_not_jam_the_replay(kafka_settings, tmp_path):
    """A record over the limit already in the spool (written by an earlier process, before
    the limit was known) is set aside at replay; the records behind it are delivered."""
    codec, spool_dir = Codec(), tmp_path / "spool"
    spool = Spool(spool_dir)
    expected = []
    for i in range(201):
        value = span(i, text=noise(1_100_000) if i == 100 else "")
        spool.append(kafka_settings.topics.spans, value["rollout_id"].encode(),
                     codec.encode("Span", value))
        expected += [] if i == 100 else [str(i)]
    spool.close()
    pub = Publisher(kafka_settings, name="replay", spool_dir=spool_dir)
    try:
        assert pub.flush(60) == 0
        assert pub.counts["dead_lettered"] == 1 and pub.counts["sent"] == 200
    finally:
        pub.close(10)
    check_order(consume(kafka_settings.kafka.bootstrap_servers, kafka_settings.topics.spans,
                        200), expected)
    from producers.dead_letters import read_dead_letters

    assert len(read_dead_letters(spool_dir / "dead-letters.log")) == 1


def test_a_topic_limit_lowered_under_a_running_publisher(kafka_settings, tmp_path):
    """An operator lowers the spans topic's max.message.bytes to 20,000 while the publisher
    runs with the old limit: the broker refuses the whole batch holding a 60 KB span (small
    spans of the same partition included), which the publisher's `enable.gapless.guarantee`
    turns into a fatal error, so no later batch of that partition overtakes it. The publisher
    reads the new limit, makes a new producer, sets the large span aside and sends the others
    again, in order. (Without gapless, librdkafka went on delivering the later batches and the
    refused batch's spans, sent again, arrived after them: a rollout out of order.)"""
    settings = with_publisher(kafka_settings, retry_backoff_ms=100)
    spans_topic = settings.topics.spans
    pub = Publisher(settings, name="lowered", spool_dir=tmp_path / "spool")
    try:
        wait_until(lambda: spans_topic in pub.health()["delivery"]["topic_limits"], 30,
                   "the publisher reading the topics' limits")
        set_topic_config(settings.kafka.bootstrap_servers, spans_topic, "max.message.bytes",
                         "20000")
        expected = []
        for i in range(200):
            pub.publish_span(span(i, rollouts=4, text=noise(60_000) if i == 100 else ""))
            expected += [] if i == 100 else [str(i)]
        assert pub.flush(60) == 0
        check_order(consume(settings.kafka.bootstrap_servers, spans_topic, 199), expected)
        assert pub.counts["dead_lettered"] == 1
        assert sum(errors_by_name(pub).values()) >= 1, "the refusal is counted"
        health = pub.health()
        assert health["delivery"]["state"] == "running" and health["ok"], health
        assert health["delivery"]["record_limit_bytes"] == 20000 - 61 - 36
    finally:
        pub.close(10)


def test_a_missing_topic_holds_records_until_it_exists(kafka_broker, topic_settings, tmp_path):
    """A gateway started before `tracetrain topics create`: Kafka reports the topics unknown;
    the records stay spooled, show in health and metrics, and go out in order once the
    topics exist."""
    from testkit.fixtures.kafka import settings_with

    settings = with_publisher(
        settings_with(kafka=kafka_broker, topics=topic_settings, home=tmp_path),
        # librdkafka waits 30 s by default before it calls a topic missing
        librdkafka={"topic.metadata.propagation.max.ms": 1000},
        retry_backoff_ms=200, retry_backoff_max_ms=1000)
    pub = Publisher(settings, name="early", spool_dir=tmp_path / "spool")
    try:
        for i in range(200):
            pub.publish_span(span(i, rollouts=20))
        for r in range(20):
            pub.publish_reward(new_reward(f"r{r}", 1.0))
        time.sleep(3)  # librdkafka has called the topics missing: nothing may be dropped
        assert pub.pending() == 220 and pub.counts["sent"] == 0
        wait_until(lambda: errors_by_name(pub).get("UNKNOWN_TOPIC_OR_PART", 0) >= 1, 30,
                   "a delivery error for the missing topic")
        health = pub.health()
        assert health["delivery"]["state"] == "retrying" and not health["ok"]
        assert "Unknown topic" in health["delivery"]["error"]
        topics.create_topics(kafka_broker.bootstrap_servers, topic_settings)
        assert pub.flush(60) == 0
        wait_until(lambda: pub.health()["ok"], 10, "health back to ok")
    finally:
        pub.close(10)
    check_order(consume(kafka_broker.bootstrap_servers, settings.topics.spans, 200),
                [str(i) for i in range(200)])
    rewards = consume(kafka_broker.bootstrap_servers, settings.topics.rewards, 20,
                      name="Reward")
    assert sorted(k for k, _r in rewards) == sorted(f"r{r}" for r in range(20))


def test_the_delivery_thread_survives_a_failure_of_its_own(kafka_settings, tmp_path,
                                                           monkeypatch):
    """An exception the delivery loop did not expect (here the spool's read, failing once)
    is logged and counted, the thread starts again from the spool, and nothing is lost."""
    settings = with_publisher(kafka_settings, queue_max_messages=50, retry_backoff_ms=100)
    pub = Publisher(settings, name="crash", spool_dir=tmp_path / "spool")
    real_read, failures = pub._spool.read, []

    def read_failing_once(*pos):
        if not failures:
            failures.append(pos)
            raise RuntimeError("an unforeseen failure")
        return real_read(*pos)

    monkeypatch.setattr(pub._spool, "read", read_failing_once)
    try:
        for i in range(500):
            pub.publish_span(span(i))
        assert pub.flush(60) == 0
        assert failures, "the failure should have happened in spool mode"
        health = pub.health()
        assert health["delivery"]["restarts"] == 1 and health["delivery"]["alive"]
        assert errors_by_name(pub) == {"exception": 1.0}
        assert health["ok"], health
    finally:
        pub.close(10)
    check_order(consume(settings.kafka.bootstrap_servers, settings.topics.spans, 500),
                [str(i) for i in range(500)])
