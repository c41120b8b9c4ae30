"""Producing a workload's events to a test's topics and reading records back, for the streams
tests (the worker reads what `produce` writes; `consume` returns raw key, value, headers)."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from schemas import Codec


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
