"""Re-run the stream processing over a range of history, with other reward shaping, into a new
transitions topic (the first half of `tracetrain replay --topic spans`; learner/replay.py trains
from the result).

1. Copy: the spans of the range, and the rewards and producer-sent AirEvents of the rollouts
   those spans belong to, into the topics of prefix `<prefix>-replay-<experiment>`. Each copy
   keeps its partition, key, headers and record time, so the join sees the order and timing it
   saw live. AirEvents the live worker derived are left out: the replay derives them anew with
   its own rules. The replay topics keep their records forever (retention -1): the copies carry
   old record times, which a time retention would delete at once.
2. Join: a real Faust worker (`python -m streams`) with the replay's streams settings on those
   topics, until it has read every input record and closed every rollout. Rollouts that never
   got a final reward close by the idle time-out (short by default here: nothing more will come)
   and go to the replay's DLQ, or are emitted, per `on_timeout`.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer, TopicPartition

from infra import processes, services, topics
from streams.errors import StreamsError
from streams.join import DERIVED
from streams.service import STREAMS
from streams.web import state_url
from tracetrain.settings import Settings

REPLAY_IDLE_TIMEOUT_S = 10.0


class ReplayError(StreamsError):
    """A replay's copy or worker did not finish; its topics are incomplete."""


@dataclass
class Rebuilt:
    """What a rebuild copied and what its worker made of it."""

    settings: Settings  # the replay's settings: its topics, its streams section
    copied: Counter = field(default_factory=Counter)  # records per topic short name
    rollouts: int = 0
    transitions: int = 0
    closed: dict[str, float] = field(default_factory=dict)  # close reason -> rollouts
    dlq: dict[str, float] = field(default_factory=dict)  # DLQ reason -> records

    def summary(self) -> dict:
        return {"topic": self.settings.topics.transitions, "rollouts": self.rollouts,
                "copied": dict(self.copied), "transitions": self.transitions,
                "closed": self.closed, "dlq": self.dlq}


def replay_settings(settings: Settings, experiment: str, streams_update: dict) -> Settings:
    """The replay's own topics (prefix `<prefix>-replay-<experiment>`, kept forever), consumer
    group and state folder, and the streams settings with `streams_update` applied."""
    from pydantic import ValidationError

    from tracetrain.settings.infra import TopicSettings
    from tracetrain.settings.streams import StreamsSettings

    prefix = f"{settings.topics.prefix}-replay-{experiment}"
    try:  # validated (model_copy is not): the prefix check is TopicSettings' own
        topic_cfg = TopicSettings.model_validate(
            {**settings.topics.model_dump(), "prefix": prefix, "retention_ms": -1})
    except ValidationError as exc:
        raise ReplayError(f"--experiment {experiment!r} names the replay's topics: "
                          f"{exc.errors()[0]['msg']}") from exc

    streams = StreamsSettings.model_validate({
        **settings.streams.model_dump(),
        "idle_timeout_s": min(settings.streams.idle_timeout_s, REPLAY_IDLE_TIMEOUT_S),
        **streams_update, "web_port": processes.free_port(settings.streams.web_host)})
    return settings.model_copy(update={"topics": topic_cfg, "streams": streams})


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise ReplayError(f"topic {topic!r} does not exist on the cluster")
    return sorted(meta.partitions)


def _read(consumer: Consumer, topic: str, ranges: dict[int, tuple[int, int]],
          progress: Callable[[], None]):
    """Yield the records of `topic` in [first, last) per partition, partition by partition."""
    for partition, (first, last) in sorted(ranges.items()):
        if last <= first:
            continue
        consumer.assign([TopicPartition(topic, partition, first)])
        quiet_polls = 0
        while True:
            batch = consumer.consume(1000, timeout=1.0)
            for msg in batch:
                if msg.error() is not None:
                    raise ReplayError(f"reading {topic}[{partition}]: {msg.error()}")
                if msg.offset() >= last:
                    break
                progress()
                yield msg
            else:
                # Offsets with no record (transaction markers, compaction) can end a range
                # before `last` is seen: the consumer's position tells.
                position = consumer.position([TopicPartition(topic, partition)])[0].offset
                if position < last:
                    quiet_polls = 0 if batch else quiet_polls + 1
                    if quiet_polls < 30:
                        continue
                    raise ReplayError(f"{topic}[{partition}]: no record at offset {position} "
                                      f"for 30 s, though the range ends at {last}")
            break


def copy_history(settings: Settings, replay: Settings, spans_range: dict[int, tuple[int, int]],
                 progress: Callable[[str], None] = lambda short: None) -> Rebuilt:
    """Step 1. `spans_range`: partition -> [first, last) offsets of the live spans topic."""
    live, bootstrap = settings.topics, settings.kafka.bootstrap_servers
    existing = {t.name: t for t in topics.describe_topics(bootstrap, replay.topics)}
    used = [name for name, info in existing.items() if info.messages]
    if used:
        raise ReplayError(f"the replay topics of this experiment exist already and hold records "
                          f"({', '.join(sorted(used))}); choose another --experiment, or train "
                          f"from them: tracetrain replay --topic {replay.topics.transitions} "
                          "--from 0 --experiment NAME")
    topics.create_topics(bootstrap, replay.topics)
    # earliest: a range starting before the log start (retention) begins at the first record
    # kept, instead of librdkafka's default jump to the end
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tracetrain-replay-copy",
                         "enable.auto.commit": False, "enable.partition.eof": False,
                         "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "compression.type": "lz4"})
    result, rollouts = Rebuilt(replay), set()

    def copy(short: str, msg) -> None:
        while True:
            try:
                producer.produce(replay.topics.name(short), key=msg.key(), value=msg.value(),
                                 partition=msg.partition(), timestamp=msg.timestamp()[1],
                                 headers=msg.headers())
                break
            except BufferError:  # local queue full: let deliveries drain it
                producer.poll(0.5)
        producer.poll(0)
        result.copied[short] += 1

    try:
        for msg in _read(consumer, live.spans, spans_range, lambda: progress("spans")):
            rollouts.add(msg.key())
            copy("spans", msg)
        # Rewards and producer-sent AirEvents of those rollouts, wherever they are in their
        # topics (a reward can come long after the spans' range ends).
        for short in ("rewards", "air"):
            topic = live.name(short)
            ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    for p in _partitions(consumer, topic)}
            for msg in _read(consumer, topic, ends, lambda s=short: progress(s)):
                if msg.key() in rollouts and DERIVED not in (msg.headers() or []):
                    copy(short, msg)
        left = producer.flush(60)
        if left:
            raise ReplayError(f"{left} copied records were not delivered to "
                              f"{bootstrap} within 60 s; the replay topics are incomplete")
    finally:
        consumer.close()
    result.rollouts = len(rollouts)
    return result


def _worker_state(url: str) -> dict:
    """The worker's typed state (streams/web.py's /state page)."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


def join_history(result: Rebuilt, timeout_s: float = 1800.0) -> Rebuilt:
    """Step 2: a worker on the replay topics until every input record is read and every
    rollout closed; its counts into `result`."""
    replay = result.settings
    record = services.start(replay, STREAMS, instance=f"streams-replay-{replay.topics.prefix}")
    inputs = 3 * topics.planned_partitions(replay.topics)["spans"]  # lag gauges: spans, rewards, air
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            state = _worker_state(state_url(replay.streams))
            lags = [lag for partitions in state["lag"].values() for lag in partitions.values()]
            open_now = state["open_rollouts"]
            caught_up = len(lags) >= inputs and all(lag == 0 for lag in lags) and \
                state["input_records"].get("spans", 0) >= result.copied["spans"]
            if caught_up and open_now == 0:
                break
            if time.monotonic() > deadline:
                raise ReplayError(f"the replay worker did not finish within {timeout_s:.0f} s "
                                  f"(lag {lags}, {open_now:.0f} rollouts open); log: {record.log}")
            if not processes.pid_alive(record.pid):
                raise ReplayError(f"the replay worker exited; see {record.log}")
            time.sleep(1.0)
        result.transitions = state["output_transitions"]
        result.closed = state["closed_rollouts"]
        result.dlq = state["dlq_records"]
    finally:
        processes.stop(replay.home_dir, record.name, timeout_s=30)
    return result


def rebuild(settings: Settings, experiment: str, spans_range: dict[int, tuple[int, int]],
            streams_update: dict, on_copy: Callable[[str], None] = lambda short: None) -> Rebuilt:
    """Steps 1 and 2: the replay's transitions topic, from the spans in `spans_range`.
    `on_copy(short)` after each record read."""
    replay = replay_settings(settings, experiment, streams_update)
    return join_history(copy_history(settings, replay, spans_range, on_copy))
