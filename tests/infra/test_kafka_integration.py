"""The real broker: 10,000 spans through the codec and back, idempotent topic creation,
and a three-broker cluster with replication 3."""

from __future__ import annotations

import random
import socket
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from infra import processes, topics
from infra.kafka import broker
from schemas import Codec
from testkit.records import span
from tracetrain.errors import ConfigError, InfraError
from tracetrain.settings.infra import KafkaSettings, TopicSettings

pytestmark = pytest.mark.integration


def test_ten_thousand_spans_round_trip(kafka_settings):
    codec = Codec()
    rng = random.Random(3)
    sent = {}
    producer = Producer({"bootstrap.servers": kafka_settings.kafka.bootstrap_servers,
                         "enable.idempotence": True, "acks": "all", "compression.type": "lz4",
                         "linger.ms": 5})
    for i in range(10_000):
        record = span(rng, prompt_tokens=rng.randrange(1, 60), response_tokens=rng.randrange(1, 30))
        record["span_id"] = f"s{i}"
        sent[record["span_id"]] = record
        producer.produce(kafka_settings.topics.spans, key=record["rollout_id"].encode(),
                         value=codec.encode("Span", record))
        producer.poll(0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka_settings.kafka.bootstrap_servers,
                         "group.id": f"g-{kafka_settings.topics.prefix}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([kafka_settings.topics.spans])
    received = {}
    try:
        idle = 0
        while len(received) < len(sent) and idle < 30:
            batch = consumer.consume(1000, timeout=1.0)
            idle = 0 if batch else idle + 1
            for msg in batch:
                assert msg.error() is None, msg.error()
                record = codec.decode(msg.value(), "Span")
                assert msg.key().decode() == record["rollout_id"]
                assert record["span_id"] not in received, "a span arrived twice"
                received[record["span_id"]] = record
    finally:
        consumer.close()
    assert len(received) == 10_000
    for span_id, record in sent.items():
        got = received[span_id]
        assert got["llm"]["prompt_token_ids"] == record["llm"]["prompt_token_ids"]
        assert got["llm"]["response_token_ids"] == record["llm"]["response_token_ids"]
        assert got["trace_id"] == record["trace_id"] and got["attributes"] == record["attributes"]


def test_topic_creation_twice_is_a_no_op(kafka_broker, topic_settings):
    bootstrap = kafka_broker.bootstrap_servers
    first = topics.create_topics(bootstrap, topic_settings)
    assert sorted(first) == sorted(topic_settings.name(s) for s in topics.ALL_TOPICS)
    assert topics.create_topics(bootstrap, topic_settings) == []
    listed = {t.name: t for t in topics.describe_topics(bootstrap, topic_settings)}
    assert listed[topic_settings.spans].partitions == 4
    assert listed[topic_settings.checkpoints].partitions == 1
    assert all(t.messages == 0 for t in listed.values())


def test_co_partitioning_mismatch_is_refused(kafka_broker, topic_settings):
    with pytest.raises(ConfigError, match="same partition count"):
        topics.create_topics(kafka_broker.bootstrap_servers,
                             topic_settings.model_copy(update={"rewards_partitions": 2}))
    topics.create_topics(kafka_broker.bootstrap_servers, topic_settings)
    # Existing topics with 4 partitions, settings now asking for 8: refused, not altered.
    with pytest.raises(InfraError, match="exists with 4 partitions, settings say 8"):
        topics.create_topics(kafka_broker.bootstrap_servers,
                             topic_settings.model_copy(update={"partitions": 8}))


def test_port_taken_is_a_clear_error(kafka_broker, tmp_path):
    taken = int(kafka_broker.bootstrap_servers.rsplit(":", 1)[1])
    with pytest.raises(InfraError, match=f"port 127.0.0.1:{taken} for Kafka broker 1 is already taken"):
        broker.start(tmp_path, KafkaSettings(port=taken, controller_port=processes.free_port()))


@pytest.mark.slow
def test_three_brokers_replicate_three_ways(kafka_home):
    base, cbase = processes.free_ports(3), processes.free_ports(3)
    kafka = KafkaSettings(port=base, controller_port=cbase, heap_mb=256, brokers=3)
    try:
        started = broker.start(kafka_home, kafka, brokers=3)
        assert len(started) == 3
        bootstrap = broker.bootstrap(kafka, 3)
        settings = TopicSettings(prefix="three", replication=3, min_insync_replicas=2)
        topics.create_topics(bootstrap, settings)
        infos = topics.describe_topics(bootstrap, settings)
        assert infos and all(t.replication == 3 for t in infos)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        producer.produce(settings.spans, key=b"r", value=Codec().encode("Span", span()))
        assert producer.flush(30) == 0
        # the log cleaner's buffer fits a small heap: Kafka's 128 MiB in one piece killed a
        # 256 MB broker at start-up now and then (OutOfMemoryError)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        resource = ConfigResource(ConfigResource.Type.BROKER, "1")
        config = admin.describe_configs([resource])[resource].result(timeout=30)
        assert int(config["log.cleaner.dedupe.buffer.size"].value) == 32 * 1024 * 1024
    finally:
        assert sorted(broker.stop(kafka_home)) == ["kafka-1", "kafka-2", "kafka-3"]


@pytest.mark.slow
def test_a_broker_that_cannot_bind_its_port_fails_the_start_at_once_with_its_own_log(kafka_home):
    """A port bound but not listening passes the start's free-port check (nothing answers
    there), as one taken meanwhile by an outgoing connection does; broker 2 then cannot bind
    its controller port. Its peers would wait the whole start-up bound for it."""
    base, cbase = processes.free_ports(3), processes.free_ports(3)
    kafka = KafkaSettings(port=base, controller_port=cbase, heap_mb=256, brokers=3,
                          start_timeout_s=120.0)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", cbase + 1))
        began = time.monotonic()
        with pytest.raises(InfraError, match=r"Kafka \(kafka-2\) exited during start-up") as err:
            broker.start(kafka_home, kafka, brokers=3)
        assert time.monotonic() - began < 60
    assert f"{cbase + 1}" in str(err.value)  # the tail of kafka-2's own log names the port
    assert broker.stop(kafka_home) == []  # the two that started were stopped with it
