"""Micro-batches of transitions from Kafka: the learner's consumer.

    batcher = TransitionBatcher(settings, start_offsets=ckpt_offsets)   # learner/loop.py
    batch = batcher.next_batch(current_version=7)

Reads `settings.topics.transitions` in consumer group `settings.learner.group_id` with
confluent-kafka, auto-commit off (offsets are committed only after a checkpoint holding them is
registered: `commit`). Writes bad records to `settings.topics.dlq` with the original key and
bytes and the headers of the one DLQ contract (`tracetrain.deadletter`): undecodable ones,
ones with rewards outside `rewards.max_abs` or non-finite behaviour logprobs, token ids outside
the vocabulary; and, through `dead_letter`, transitions the loop could not train on. A batch
closes at `batch_size` accepted transitions or `batch_timeout_s` after its first record.
Duplicate `transition_id`s are skipped (learner/dedupe.py: exact, bounded, restart-safe), stale
policy versions dropped or down-weighted; every skip is counted in `counters` under its reason.
After a rebalance a partition resumes where this learner's reading of it stopped (not at the
offsets it started from); broker errors other than fatal ones (an outage) are logged and
waited out.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from threading import Event

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from learner.dedupe import BEYOND_WINDOW, DUPLICATE, DedupeWindow
from learner.errors import LearnerError
from schemas import Codec, CodecError
from tracetrain.deadletter import dead_letter_headers
from tracetrain.rewards import OUT_OF_BOUNDS, reward_problem
from tracetrain.settings import Settings

log = logging.getLogger("tracetrain.learner")
REWARDS = ("credited_return", "final_reward", "intermediate_reward")
ERROR_LOG_EVERY_S = 30.0  # a broker outage logs a line this often, not one per poll


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


def check_transition(t: dict, max_reward: float) -> tuple[str, str] | None:
    """(reason, detail) when a decoded transition cannot be trained on, or None."""
    if not t["response_token_ids"]:
        return "empty_response", "no response token ids"
    if t["behaviour_logprobs"] and len(t["behaviour_logprobs"]) != len(t["response_token_ids"]):
        return "logprobs_length_mismatch", (f"{len(t['behaviour_logprobs'])} behaviour logprobs "
                                            f"for {len(t['response_token_ids'])} response tokens")
    if any(i < 0 for i in t["prompt_token_ids"]) or any(i < 0 for i in t["response_token_ids"]):
        return "negative_token_id", "a token id below 0"
    for name in REWARDS:
        problem = reward_problem(t[name], max_reward)
        if problem:
            return OUT_OF_BOUNDS, f"{name} {problem}"
    if not all(map(math.isfinite, t["behaviour_logprobs"])):
        return "non_finite_logprob", "a behaviour logprob that is NaN or infinite"
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
        dedupe: dict | None = None,
        vocab_size: int | None = None,
    ):
        """`dedupe`: a checkpoint's `DedupeWindow.state_dict()`."""
        self.settings = settings
        self.learner = settings.learner
        self.topic = topic or settings.topics.transitions
        self.codec = Codec(registry_url=settings.schema_registry.url)
        self.counters: Counter = Counter()
        self.vocab_size = vocab_size
        self.seen = DedupeWindow(self.learner.dedupe_window)
        if dedupe:
            self.seen.load_state_dict(dedupe)
        self._error_logged = 0.0
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
        # Where this learner's reading of a partition stopped wins (a rebalance must not go
        # back to the offsets of process start: what was read since is in memory or trained);
        # then a checkpoint's offsets, over the group's committed ones (they may be ahead of
        # it, or behind it after a crash between commit and checkpoint of a newer run).
        for p in partitions:
            key = tp_key(p.topic, p.partition)
            if key in self.position:
                p.offset = self.position[key]
            elif self._start_offsets is not None:
                p.offset = OFFSET_BEGINNING
        consumer.assign(partitions)

    def group_metadata(self):
        """The consumer group's metadata, for offsets committed in a producer's transaction."""
        return self._consumer.consumer_group_metadata()

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
                self._broker_error(msg.error())
                continue
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

    def _broker_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise LearnerError(f"consuming {self.topic} failed for good: {error}")
        self.counters["kafka_errors"] += 1
        if time.monotonic() - self._error_logged >= ERROR_LOG_EVERY_S:
            self._error_logged = time.monotonic()
            log.warning("consuming %s: %s; waiting for the broker (%d errors so far)",
                        self.topic, error, self.counters["kafka_errors"])

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
        problem = check_transition(t, self.settings.rewards.max_abs)
        if problem is None and self.vocab_size is not None:
            top = max(t["prompt_token_ids"] + t["response_token_ids"])
            if top >= self.vocab_size:
                problem = ("token_id_out_of_vocab",
                           f"token id {top}: expected below the vocabulary size {self.vocab_size}")
        if problem:
            return self._dead_letter(msg, *problem, batch)
        seen = self.seen.check(t)
        if seen == DUPLICATE:
            self._skip(DUPLICATE, batch)
            return
        if seen == BEYOND_WINDOW:
            return self._dead_letter(msg, BEYOND_WINDOW, (
                f"emitted_ns {t['emitted_ns']} is not after {self.seen.horizon_ns}, the newest of "
                f"the ids the window of learner.dedupe_window={self.learner.dedupe_window} has "
                "forgotten: it may be a copy of one of them"), batch)
        behind = 0 if t["policy_version"] is None else max(0, current_version - t["policy_version"])
        weight = 1.0
        if behind > self.learner.max_staleness:
            if self.learner.staleness_policy == "drop":
                self._skip("stale", batch)
                return
            weight = self.learner.staleness_weight ** (behind - self.learner.max_staleness)
            self.counters["stale_downweighted"] += 1
        self.seen.add(t)
        self.counters["accepted"] += 1
        if t.get("retokenized"):
            self.counters["accepted_retokenized"] += 1
        # where it came from, for `dead_letter` (plain values: it may travel in a checkpoint)
        t["_source"] = [msg.topic(), msg.partition(), msg.offset()]
        batch.transitions.append(t)
        batch.weights.append(weight)
        batch.staleness.append(behind)

    def _skip(self, reason: str, batch: MicroBatch) -> None:
        self.counters[reason] += 1
        batch.skipped[reason] += 1

    def _dead_letter(self, msg, reason: str, detail: str, batch: MicroBatch) -> None:
        self._skip(f"dlq:{reason}", batch)
        headers = dead_letter_headers(msg.topic(), msg.partition(), msg.offset(), reason=reason,
                                      detail=detail)
        self._dlq.produce(self.settings.topics.dlq, key=msg.key(), value=msg.value(),
                          headers=headers)

    def dead_letter(self, transitions: list[dict], reason: str, detail: str) -> None:
        """Send accepted transitions the loop could not train on to the DLQ, counted under
        `dlq:<reason>`: re-encoded (the same record), with their source topic, partition and
        offset in the headers."""
        self.counters[f"dlq:{reason}"] += len(transitions)
        for t in transitions:
            # (a checkpoint written before sources were kept has none)
            topic, partition, offset = t.get("_source") or (self.topic, -1, -1)
            record = {k: v for k, v in t.items() if not k.startswith("_")}
            self._dlq.produce(self.settings.topics.dlq, key=t["rollout_id"].encode(),
                              value=self.codec.encode("Transition", record),
                              headers=dead_letter_headers(topic, partition, offset,
                                                          reason=reason, detail=detail))
        self._dlq.flush(10)

    def commit(self, offsets: dict[str, int]) -> None:
        """Commit `offsets` for the group, synchronously (called after registration)."""
        if not offsets:
            return
        parts = [TopicPartition(*split_key(k), v) for k, v in offsets.items()]
        self._consumer.commit(offsets=parts, asynchronous=False)

    def close(self) -> None:
        self._dlq.flush(10)
        self._consumer.close()
