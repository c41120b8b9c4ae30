"""The task agent's rollouts, read back from Kafka: the spans and rewards topics, with a
consumer group of the optimiser's own, from its committed position (the first record, the
first time) up to the end offsets the run began with.

    batch = read_rollouts(settings)              # RolloutBatch: rollouts + offsets read
    worst(batch.rollouts, k=6)                   # the lowest-reward rollouts, oldest first

A rollout is kept when it has a final reward and at least one LLM span of the configured
agent; its transcript is the last call's messages from the problem on, plus the answer.
Records that do not decode are counted and skipped: the streams worker reads the same topics
and dead-letters them with their reason (tracetrain/deadletter.py), so a second copy here
would only duplicate the dead letter.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from optimizer.errors import OptimizerError
from schemas import Codec
from tracetrain.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
# A new group's coordinator is still being elected or loaded: librdkafka's committed() and
# commit() report it once instead of waiting.
_COORDINATOR_NOT_READY = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                          KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._TIMED_OUT}


def _with_coordinator(what: str, call: Callable[[], T], timeout_s: float = 30.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() not in _COORDINATOR_NOT_READY or time.monotonic() > deadline:
                raise OptimizerError(f"{what}: {error.str()}") from exc
            time.sleep(0.5)


@dataclass
class Rollout:
    rollout_id: str
    reward: float
    question: str
    transcript: list[dict]       # chat messages from the problem on, the final answer last
    position: tuple[str, int, int]  # (topic, partition, offset) of the final reward


@dataclass
class RolloutBatch:
    rollouts: list[Rollout]
    # topic -> partition -> [first, next) offsets this run read
    ranges: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    skipped: int = 0   # records that did not decode
    consumer: Consumer | None = None  # to commit once the run's versions are registered

    def commit(self) -> None:
        if self.consumer is None:
            return
        offsets = [TopicPartition(topic, p, end) for topic, parts in self.ranges.items()
                   for p, (_, end) in parts.items()]
        if offsets:
            consumer = self.consumer
            _with_coordinator("committing the optimiser group's offsets", lambda: consumer.commit(
                offsets=offsets, asynchronous=False))

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None


def worst(rollouts: list[Rollout], k: int) -> list[Rollout]:
    """The `k` lowest-reward rollouts; among equal rewards the ones read first (stable), so
    the same history gives the same selection."""
    if k < 1:
        raise OptimizerError(f"k={k}: expected at least 1 rollout to learn from")
    return sorted(rollouts, key=lambda r: r.reward)[:k]


def transcript_of(spans: list[dict]) -> tuple[str, list[dict]] | None:
    """(question, transcript) from a rollout's LLM spans in start order; None without one."""
    calls = [s for s in sorted(spans, key=lambda s: s["start_time_ns"])
             if s["kind"] == "llm" and s.get("llm")]
    if not calls:
        return None
    try:
        first = json.loads(calls[0]["llm"].get("request_messages") or "[]")
        last = json.loads(calls[-1]["llm"].get("request_messages") or "[]")
    except json.JSONDecodeError:
        return None
    if not isinstance(first, list) or not isinstance(last, list):
        return None
    users = [i for i, m in enumerate(first) if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        return None
    # the problem is the first call's last user turn; system prompt and demonstration precede it
    start = users[-1]
    answer = {"role": "assistant", "content": calls[-1]["llm"].get("response_text") or ""}
    return str(first[start].get("content", "")), [*last[start:], answer]


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise OptimizerError(f"topic {topic!r} does not exist; the rollouts are read from it")
    return sorted(meta.partitions)


def read_rollouts(settings: Settings, timeout_s: float = 60.0) -> RolloutBatch:
    """Every record from the group's position to the end offsets at the start (at most
    optimizer.max_records), joined into rollouts. The consumer stays open for `commit`."""
    opt, topics = settings.optimizer, settings.topics
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                         "group.id": opt.group_id, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "enable.partition.eof": False})
    codec = Codec(registry_url=settings.schema_registry.url)
    batch = RolloutBatch([], consumer=consumer)
    spans: dict[str, list[dict]] = {}
    finals: dict[str, tuple[float, tuple[str, int, int]]] = {}
    budget = opt.max_records
    try:
        for topic, name in ((topics.spans, "Span"), (topics.rewards, "Reward")):
            parts = _partitions(consumer, topic)
            wanted = [TopicPartition(topic, p) for p in parts]
            committed = _with_coordinator(
                f"reading group {opt.group_id!r}'s position on {topic}",
                lambda wanted=wanted: consumer.committed(wanted, timeout=10))
            for tp in committed:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                           timeout=10)
                first = max(low, tp.offset if tp.offset >= 0 else low)
                end = min(high, first + budget)
                budget -= end - first
                batch.ranges.setdefault(topic, {})[tp.partition] = (first, end)
                for msg in _range(consumer, topic, tp.partition, first, end, timeout_s):
                    try:
                        record = codec.decode(msg.value(), name)
                    except Exception:  # noqa: BLE001 (any damage: the worker dead-letters it)
                        batch.skipped += 1
                        continue
                    if name == "Span":
                        if record.get("agent_name") == opt.agent:
                            spans.setdefault(record["rollout_id"], []).append(record)
                    elif record.get("final", True):
                        finals[record["rollout_id"]] = (float(record["value"]),
                                                        (topic, msg.partition(), msg.offset()))
    except Exception:
        consumer.close()
        raise
    for rollout_id, (value, position) in finals.items():
        found = transcript_of(spans.get(rollout_id, []))
        if found is not None:
            batch.rollouts.append(Rollout(rollout_id, value, found[0], found[1], position))
    batch.rollouts.sort(key=lambda r: r.position)
    if batch.skipped:
        log.warning("%d span/reward records did not decode and were skipped", batch.skipped)
    return batch


def _range(consumer: Consumer, topic: str, partition: int, first: int, end: int,
           timeout_s: float):
    """The records at [first, end) of one partition."""
    if first >= end:
        return
    consumer.assign([TopicPartition(topic, partition, first)])
    quiet = 0.0
    while True:
        msg = consumer.poll(1.0)
        if msg is None:
            quiet += 1.0
            # offsets with no record (transaction markers) end a range early: position tells
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if position >= end:
                return
            if quiet > timeout_s:
                raise OptimizerError(f"{topic}[{partition}]: no record at offset {position} "
                                     f"for {timeout_s:.0f} s, though the range ends at {end}")
            continue
        if msg.error() is not None:
            raise OptimizerError(f"reading {topic}[{partition}]: {msg.error()}")
        quiet = 0.0
        if msg.offset() >= end:
            return
        yield msg
        if msg.offset() + 1 >= end:
            return
