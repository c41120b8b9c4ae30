"""Micro-batches of transitions from Kafka: the learner's consumer.

    batcher = TransitionBatcher(settings, start_offsets=ckpt_offsets)   # learner/loop.py
    batch = batcher.next_batch(current_version=7)

Reads `settings.topics.transitions` in consumer group `settings.learner.group_id` with
confluent-kafka, auto-commit off (offsets are committed only after a checkpoint holding them is
registered: `commit`). Writes bad records to `settings.topics.dlq` with the original key and
bytes and the headers of the one DLQ contract (`tracetrain.deadletter`). A batch
closes at `batch_size` accepted transitions or `batch_timeout_s` after its first record.
Duplicate `transition_id`s are skipped, stale policy versions dropped or down-weighted; every
skip is counted in `counters` under its reason.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from threading import Event

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from learner.errors import LearnerError
from schemas import Codec, CodecError
from tracetrain.deadletter import dead_letter_headers
from tracetrain.settings import Settings


def tp_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def split_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition(":")
    return topic, int(partition)


@dataclass
class MicroBatch:
    transitions: list[dict]
    weights: list[float]
    staleness: list[int]
    # Next offset to consume per "topic:partition" once this batch is trained: the resume point.
    offsets: dict[str, int]
    first_record_s: float = 0.0
    closed_by: str = "size"
    skipped: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self.transitions)


def check_transition(t: dict) -> str | None:
    """The reason a decoded transition cannot be trained on, or None."""
    if not t["response_token_ids"]:
        return "empty_response"
    if t["behaviour_logprobs"] and len(t["behaviour_logprobs"]) != len(t["response_token_ids"]):
        return "logprobs_length_mismatch"
    if any(i < 0 for i in t["prompt_token_ids"]) or any(i < 0 for i in t["response_token_ids"]):
        return "negative_token_id"
    return None


class TransitionBatcher:
    """Consumes transitions into micro-batches; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        *,
        topic: str | None = None,
        group_id: str | None = None,
        start_offsets: dict[str, int] | None = None,
        stop_offsets: dict[str, int] | None = None,
        seen_ids: Iterable[str] = (),
        vocab_size: int | None = None,
    ):
        self.settings = settings
        self.learner = settings.learner
        self.topic = topic or settings.topics.transitions
        self.codec = Codec(registry_url=settings.schema_registry.url)
        self.counters: Counter = Counter()
        self.vocab_size = vocab_size
        self.seen: OrderedDict[str, None] = OrderedDict((i, None) for i in seen_ids)
        self.position: dict[str, int] = dict(start_offsets or {})
        self.stop_offsets = stop_offsets
        self._start_offsets = start_offsets
        self._consumer = Consumer({
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": group_id or self.learner.group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": stop_offsets is not None,
        })
        self._dlq = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                              "enable.idempotence": True, "acks": "all"})
        self._done: set[str] = set()
        if stop_offsets is not None:
            # Replay: an explicit range, no group rebalancing, nothing read past `stop_offsets`.
            parts = [TopicPartition(*split_key(k), (start_offsets or {}).get(k, OFFSET_BEGINNING))
                     for k in stop_offsets]
            self._done = {k for k, stop in stop_offsets.items()
                          if (start_offsets or {}).get(k, 0) >= stop}
            self._consumer.assign(parts)
        else:
            self._consumer.subscribe([self.topic], on_assign=self._on_assign)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # A checkpoint's offsets win over the group's committed ones (they may be ahead of it,
        # or behind it after a crash between commit and checkpoint of a newer run).
        if self._start_offsets is not None:
            for p in partitions:
                p.offset = self._start_offsets.get(tp_key(p.topic, p.partition), OFFSET_BEGINNING)
        consumer.assign(partitions)

    @property
    def exhausted(self) -> bool:
        return self.stop_offsets is not None and self._done >= set(self.stop_offsets)

    def next_batch(self, current_version: int, timeout_s: float | None = None,
                   stop: Event | None = None, first_wait_s: float | None = None
                   ) -> MicroBatch | None:
        """The next micro-batch, closed by size, by `timeout_s` after its first record, or by
        the end of a replay range; None when nothing arrived within `first_wait_s` (default
        `timeout_s`) or the range is exhausted."""
        timeout_s = self.learner.batch_timeout_s if timeout_s is None else timeout_s
        batch = MicroBatch([], [], [], {})
        deadline = time.monotonic() + (timeout_s if first_wait_s is None else first_wait_s)
        while len(batch) < self.learner.batch_size and not self.exhausted:
            if stop is not None and stop.is_set():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                batch.closed_by = "time"
                break
            msg = self._consumer.poll(min(remaining, 0.5))
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    key = tp_key(msg.topic(), msg.partition())
                    if self.stop_offsets and self.position.get(key, 0) >= self.stop_offsets[key]:
                        self._done.add(key)
                    continue
                raise LearnerError(f"consuming {self.topic} failed: {msg.error()}")
            if not batch.first_record_s:
                batch.first_record_s = time.time()
                deadline = time.monotonic() + timeout_s
            self._take(msg, batch, current_version)
        if self.exhausted and len(batch) < self.learner.batch_size:
            batch.closed_by = "end"
        batch.offsets = dict(self.position)
        self._dlq.flush(10)
        if not batch.transitions and not batch.skipped:
            return None
        return batch

    def _take(self, msg, batch: MicroBatch, current_version: int) -> None:
        key = tp_key(msg.topic(), msg.partition())
        if self.stop_offsets is not None and msg.offset() >= self.stop_offsets.get(key, 0):
            self._done.add(key)
            return
        self.position[key] = msg.offset() + 1
        self.counters["consumed"] += 1
        try:
            t = self.codec.decode(msg.value(), name="Transition")
        except CodecError as exc:
            return self._dead_letter(msg, exc.reason, str(exc), batch)
        reason = check_transition(t)
        if reason is None and self.vocab_size is not None:
            top = max(t["prompt_token_ids"] + t["response_token_ids"])
            reason = "token_id_out_of_vocab" if top >= self.vocab_size else None
        if reason:
            return self._dead_letter(msg, reason, reason, batch)
        if t["transition_id"] in self.seen:
            self._skip("duplicate", batch)
            return
        behind = 0 if t["policy_version"] is None else max(0, current_version - t["policy_version"])
        weight = 1.0
        if behind > self.learner.max_staleness:
            if self.learner.staleness_policy == "drop":
                self._skip("stale", batch)
                return
            weight = self.learner.staleness_weight ** (behind - self.learner.max_staleness)
            self.counters["stale_downweighted"] += 1
        self._remember(t["transition_id"])
        self.counters["accepted"] += 1
        batch.transitions.append(t)
        batch.weights.append(weight)
        batch.staleness.append(behind)

    def _remember(self, transition_id: str) -> None:
        self.seen[transition_id] = None
        while len(self.seen) > self.learner.dedupe_window:
            self.seen.popitem(last=False)

    def _skip(self, reason: str, batch: MicroBatch) -> None:
        self.counters[reason] += 1
        batch.skipped[reason] += 1

    def _dead_letter(self, msg, reason: str, detail: str, batch: MicroBatch) -> None:
        self._skip(f"dlq:{reason}", batch)
        headers = dead_letter_headers(msg.topic(), msg.partition(), msg.offset(), reason=reason,
                                      detail=detail)
        self._dlq.produce(self.settings.topics.dlq, key=msg.key(), value=msg.value(),
                          headers=headers)

    def commit(self, offsets: dict[str, int]) -> None:
        """Commit `offsets` for the group, synchronously (called after registration)."""
        if not offsets:
            return
        parts = [TopicPartition(*split_key(k), v) for k, v in offsets.items()]
        self._consumer.commit(offsets=parts, asynchronous=False)

    def close(self) -> None:
        self._dlq.flush(10)
        self._consumer.close()
