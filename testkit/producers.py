"""Reading what the producers published: every record of a topic, decoded."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections import Counter

from confluent_kafka import Consumer, TopicPartition

from infra import processes
from schemas import Codec

log = logging.getLogger(__name__)


def consume(bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0,
            name: str = "Span", settle_s: float = 1.0) -> list[tuple[str, dict]]:
    """(key, decoded value) of every record of `topic`, in partition order; waits for
    `expected` records, then a little longer so that duplicates would show. Short of
    `expected` at the deadline, it logs what each partition holds on the broker against what
    was read, and the errors seen, so that a failing test says whether records are missing
    from Kafka or were not read."""
    # earliest: a fetch error that resets a partition's position must not skip its records
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "log_level": 3})
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    partitions = [TopicPartition(topic, p, 0) for p in meta.partitions]
    consumer.assign(partitions)
    codec = Codec()
    out: list[tuple[str, dict]] = []
    read: Counter = Counter()
    errors: Counter = Counter()
    deadline = time.monotonic() + timeout_s
    settle_until = None
    try:
        while time.monotonic() < deadline:
            msgs = consumer.consume(1000, timeout=0.5)
            for m in msgs:
                if m.error():
                    errors[f"{m.partition()}: {m.error().name()}"] += 1
                    continue
                read[m.partition()] += 1
                out.append((m.key().decode(), codec.decode(m.value(), name)))
            if len(out) >= expected:
                settle_until = settle_until or time.monotonic() + settle_s
                if time.monotonic() >= settle_until:
                    break
        if len(out) < expected:
            held = {tp.partition: consumer.get_watermark_offsets(tp, timeout=5)
                    for tp in partitions}
            log.warning("read %d of %d records of %s in %.0f s; per partition (low, high) on "
                        "the broker and read: %s; errors: %s", len(out), expected, topic,
                        timeout_s, {p: (held[p], read[p]) for p in sorted(held)},
                        dict(errors) or "none")
    finally:
        consumer.close()
    return out


def set_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    """Change one setting of an existing topic on the broker (as an operator would); returns
    once the broker describes the topic with it."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    client = AdminClient({"bootstrap.servers": bootstrap})
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    # The controller has it; the broker answering describe_configs may lag a moment behind.
    deadline = time.monotonic() + 30
    while True:
        [described] = client.describe_configs([ConfigResource(ConfigResource.Type.TOPIC,
                                                              topic)]).values()
        if described.result(timeout=30)[name].value == value:
            return
        assert time.monotonic() < deadline, f"{topic}: {name} still not {value} after 30 s"
        time.sleep(0.2)


def check_order(arrived: list[tuple[str, dict]], expected: list[str]) -> None:
    """Spans arrived exactly once each, each under its rollout id, and in publish order per
    rollout; `expected` is the `seq` attribute of every span that should have arrived."""
    seqs = [span["attributes"]["seq"] for _key, span in arrived]
    assert sorted(seqs) == sorted(expected), \
        f"missing {sorted(set(expected) - set(seqs))[:10]}, extra {sorted(set(seqs) - set(expected))[:10]}"
    position = {seq: i for i, seq in enumerate(expected)}
    by_rollout: dict[str, list[int]] = {}
    for key, span in arrived:
        assert key == span["rollout_id"]
        by_rollout.setdefault(key, []).append(position[span["attributes"]["seq"]])
    for key, got in by_rollout.items():
        assert got == sorted(got), f"rollout {key} out of order: {got[:20]}"


@contextlib.contextmanager
def running_gateway(settings, upstream_url: str, spool_dir, name: str, **gateway_changes):
    """A real gateway (uvicorn, own port) in front of `upstream_url`, publishing with
    `settings` to their topics; `gateway_changes` update `settings.gateway`. Yields (base url,
    the settings it runs with, its publisher); stopped and its publisher closed after."""
    from producers.gateway.app import create_app
    from producers.publisher import Publisher
    from testkit.fixed_upstream import ServerThread

    gw = settings.gateway.model_copy(update={"upstream_url": upstream_url, **gateway_changes})
    settings = settings.model_copy(update={"gateway": gw})
    pub = Publisher(settings, name=name, spool_dir=spool_dir)
    server = ServerThread(create_app(settings, publisher=pub), processes.free_port()).start()
    try:
        yield server.url, settings, pub
    finally:
        server.stop()
        pub.close(10)
