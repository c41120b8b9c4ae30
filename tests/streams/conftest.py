"""Fixtures of the streams tests: settings for a worker on this test's topics, a factory that
starts real worker processes (`tracetrain streams`) and kills them afterwards, and helpers to
produce a workload and read topics back."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from infra import processes, services
from schemas import Codec
from streams.service import STREAMS

STREAMS_DEFAULTS = {"idle_timeout_s": 6.0, "close_grace_s": 1.0, "timer_interval_s": 0.1,
                    "credit": "air"}


@pytest.fixture
def streams_settings(kafka_settings):
    """Full settings on this test's topics with a short idle timeout; web port chosen per worker."""
    streams = kafka_settings.streams.model_copy(update=STREAMS_DEFAULTS)
    return kafka_settings.model_copy(update={"streams": streams})


@pytest.fixture
def workers(request):
    """start(settings, name) -> ProcessRecord; every worker started is killed at the end."""
    started = []

    def start(settings, name="streams", **streams_overrides):
        streams = settings.streams.model_copy(update={"web_port": processes.free_port(), **streams_overrides})
        settings = settings.model_copy(update={"streams": streams})
        # a per-test name, so workers of different tests never share a pid file
        record = services.start(settings, STREAMS,
                                instance=f"{name}-{request.node.name[:30]}-{len(started)}",
                                extra_argv=["--max-seconds", "600"])
        started.append((settings, record))
        return record

    yield start
    for settings, record in started:
        processes.stop(settings.home_dir, record.name, timeout_s=5)


def produce(settings, events, codec=None, raw=()):
    """events: (topic short, key, schema name, record); raw: (topic short, key, bytes)."""
    codec = codec or Codec()
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5,
                         "partitioner": "murmur2_random", "enable.idempotence": True})
    for short, key, name, record in events:
        producer.produce(settings.topics.name(short), key=key.encode(), value=codec.encode(name, record))
        producer.poll(0)
    for short, key, value in raw:
        producer.produce(settings.topics.name(short), key=key.encode(), value=value)
    assert producer.flush(30) == 0


def consume(settings, short, done, timeout_s=90.0, group=None):
    """Read `short` from the start until done(records) or the time-out; records are
    (key, value, headers) tuples."""
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                         "group.id": group or f"reader-{time.monotonic_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    topic = settings.topics.name(short)
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
    records = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not done(records):
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() is None:
                    records.append((msg.key(), msg.value(), dict(msg.headers() or [])))
    finally:
        consumer.close()
    return records
