"""Replay: train a new experiment from a range of the transitions topic's history.

    tracetrain replay --topic transitions --from 0 [--to 2026-12-02T16:00:00] --experiment NAME

Reads the transitions topic (or another topic holding Transition records) from `--from` to
`--to` (offsets applied to every partition, or timestamps resolved per partition with
`offsets_for_times`; `--to` defaults to the end offsets when replay starts) with its own
consumer group `<group_id>-replay-<experiment>`, so the live learner's group is untouched. It
registers its checkpoints as versions of `<registered_model>-<experiment>`, so the live model's
aliases do not move. With the same seed, batch size and range it is deterministic.

    tracetrain replay --topic spans --from 0 --experiment air-credit --credit air --air-rule tool_ok=0.2

re-runs the stream processing first (streams/replay.py): the spans of the range, with their
rollouts' rewards, go through a real Faust worker with the new credit assignment or AIR rules
into `<prefix>-replay-<experiment>.transitions`, and training starts from that topic's first
offset. That topic stays, so the same shaping can be trained again with other learner settings
(`--topic <prefix>-replay-<experiment>.transitions`) without re-running the join.
"""

from __future__ import annotations

from datetime import datetime

from confluent_kafka import Consumer, TopicPartition

from learner.batches import split_key, tp_key
from learner.errors import LearnerError
from learner.loop import LoopResult, run_learner
from tracetrain.settings import Settings


def parse_position(text: str) -> tuple[str, int]:
    """("offset", n) for digits, ("time", epoch ms) for an ISO 8601 timestamp."""
    if text.isdigit():
        return "offset", int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise LearnerError(f"--from/--to {text!r}: expected an offset (digits) or an ISO 8601 "
                           "timestamp such as 2026-12-02T16:00:00+00:00") from exc
    return "time", int(moment.timestamp() * 1000)


def resolve_range(settings: Settings, topic: str, start: str, end: str | None
                  ) -> tuple[dict[str, int], dict[str, int]]:
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                         "group.id": "tracetrain-replay-probe", "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise LearnerError(f"replay topic {topic!r} does not exist on "
                               f"{settings.kafka.bootstrap_servers}")
        partitions = sorted(meta.partitions)
        high = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions}

        def at(position: str | None, default: dict[int, int]) -> dict[int, int]:
            if position is None:
                return default
            kind, value = parse_position(position)
            if kind == "offset":
                return {p: min(value, high[p]) for p in partitions}
            found = consumer.offsets_for_times([TopicPartition(topic, p, value)
                                                for p in partitions], timeout=10)
            # -1: no record at or after the time: the range for that partition ends at its end.
            return {tp.partition: high[tp.partition] if tp.offset < 0 else tp.offset
                    for tp in found}

        first = at(start, {p: 0 for p in partitions})
        last = at(end, high)
    finally:
        consumer.close()
    return ({tp_key(topic, p): o for p, o in first.items()},
            {tp_key(topic, p): o for p, o in last.items()})


def replay(settings: Settings, *, experiment: str, start: str, end: str | None = None,
           topic: str | None = None, **loop_kwargs) -> LoopResult:
    topic = topic or settings.topics.transitions
    start_offsets, stop_offsets = resolve_range(settings, topic, start, end)
    return run_learner(
        settings, experiment=experiment,
        model_name=f"{settings.mlflow.registered_model}-{experiment}",
        topic=topic, group_id=f"{settings.learner.group_id}-replay-{experiment}",
        start_offsets=start_offsets, stop_offsets=stop_offsets, **loop_kwargs)


def replay_spans(settings: Settings, *, experiment: str, start: str, end: str | None = None,
                 streams_update: dict | None = None, train: bool = True, on_copy=None,
                 **loop_kwargs):
    """Rebuild transitions from the spans in [start, end) with `streams_update` applied to the
    streams settings, then (with `train`) replay them into `experiment`.
    Returns (streams.replay.Rebuilt, LoopResult or None)."""
    from streams.replay import rebuild

    first, last = resolve_range(settings, settings.topics.spans, start, end)
    spans_range = {split_key(k)[1]: (first[k], last[k]) for k in first}
    hooks = {} if on_copy is None else {"on_copy": on_copy}
    rebuilt = rebuild(settings, experiment, spans_range, streams_update or {}, **hooks)
    if not train:
        return rebuilt, None
    return rebuilt, replay(settings, experiment=experiment, start="0",
                           topic=rebuilt.settings.topics.transitions, **loop_kwargs)
