"""The design's topics, created idempotently from settings.

    tracetrain topics create
    tracetrain topics list

spans, rewards and air are co-partitioned (same partition count, same key: rollout_id) so
that one Faust worker sees all events of a rollout; a mismatch is refused, in settings and on
the cluster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tracetrain.errors import ConfigError, InfraError
from tracetrain.settings.infra import TopicSettings

CO_PARTITIONED = ("spans", "rewards", "air")
ALL_TOPICS = ("spans", "rewards", "air", "transitions", "checkpoints", "dlq")


@dataclass
class TopicInfo:
    name: str
    partitions: int
    replication: int
    end_offsets: list[int]

    @property
    def messages(self) -> int:
        return sum(self.end_offsets)


def planned_partitions(topics: TopicSettings) -> dict[str, int]:
    counts = {short: topics.partitions for short in ALL_TOPICS}
    counts["checkpoints"] = 1  # one registry stream, read in order
    for short in CO_PARTITIONED:
        override = getattr(topics, f"{short}_partitions")
        if override is not None:
            counts[short] = override
    mismatched = {s: counts[s] for s in CO_PARTITIONED}
    if len(set(mismatched.values())) > 1:
        raise ConfigError([
            "TRACETRAIN_TOPICS__{SPANS,REWARDS,AIR}_PARTITIONS: spans, rewards and air must "
            f"have the same partition count for the rollout join (got {mismatched})"
        ])
    return counts


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topics(bootstrap: str, topics: TopicSettings, timeout_s: float = 30.0) -> list[str]:
    """Create the missing topics; return the names created (empty when all existed)."""
    counts = planned_partitions(topics)
    client = admin(bootstrap)
    existing = client.list_topics(timeout=timeout_s).topics
    for short in CO_PARTITIONED:
        name = topics.name(short)
        if name in existing and len(existing[name].partitions) != counts[short]:
            raise InfraError(
                f"topic {name} exists with {len(existing[name].partitions)} partitions, "
                f"settings say {counts[short]}: co-partitioning of spans, rewards and air "
                "would break; use another TRACETRAIN_TOPICS__PREFIX or recreate the topics"
            )
    config = {"retention.ms": str(topics.retention_ms),
              "min.insync.replicas": str(topics.min_insync_replicas)}
    wanted = [
        NewTopic(topics.name(short), num_partitions=counts[short],
                 replication_factor=topics.replication, config=config)
        for short in ALL_TOPICS if topics.name(short) not in existing
    ]
    if not wanted:
        return []
    created = []
    for name, future in client.create_topics(wanted, request_timeout=timeout_s).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() == "TOPIC_ALREADY_EXISTS":  # another process won the race
                continue
            raise InfraError(f"could not create topic {name}: {exc.args[0].str()}") from exc
    wait_for_leaders(bootstrap, [t.topic for t in wanted], timeout_s)
    return created


def wait_for_leaders(bootstrap: str, names: list[str], timeout_s: float) -> None:
    """Creation returns once the controller accepted it; clients need partition leaders.

    Each broker answers metadata from its own cache, which trails the controller for a
    moment (seconds on a loaded machine), so every bootstrap broker is asked in turn: a
    client that lands on a lagging one right after creation would not see the topics.
    """
    deadline = time.monotonic() + timeout_s
    for server in bootstrap.split(","):
        client = admin(server)
        while True:
            metadata = client.list_topics(timeout=timeout_s).topics
            if all(name in metadata and metadata[name].partitions
                   and all(p.leader >= 0 for p in metadata[name].partitions.values())
                   for name in names):
                break
            if time.monotonic() > deadline:
                raise InfraError(f"topics {names} have no partition leaders on {server} "
                                 f"after {timeout_s:.0f}s")
            time.sleep(0.2)


def describe_topics(bootstrap: str, topics: TopicSettings, timeout_s: float = 10.0) -> list[TopicInfo]:
    client = admin(bootstrap)
    metadata = client.list_topics(timeout=timeout_s).topics
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tracetrain-topics-list",
                         "enable.auto.commit": False})
    try:
        infos = []
        for short in ALL_TOPICS:
            name = topics.name(short)
            if name not in metadata:
                continue
            parts = metadata[name].partitions
            ends = [_end_offset(consumer, name, p, timeout_s) for p in sorted(parts)]
            replication = len(next(iter(parts.values())).replicas) if parts else 0
            infos.append(TopicInfo(name, len(parts), replication, ends))
        return infos
    finally:
        consumer.close()


def _end_offset(consumer: Consumer, topic: str, partition: int, timeout_s: float) -> int:
    # Right after creation or a leader move the client's metadata can be stale for a moment:
    # retriable errors are retried until the deadline.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)[1]
        except KafkaException as exc:
            if not exc.args[0].retriable() and exc.args[0].name() not in (
                    "NOT_LEADER_FOR_PARTITION", "_UNKNOWN_PARTITION", "LEADER_NOT_AVAILABLE"):
                raise
            if time.monotonic() > deadline:
                raise InfraError(f"no end offset for {topic}[{partition}]: {exc.args[0].str()}") from exc
            time.sleep(0.3)
