"""Prometheus metrics of a streams worker, and its typed state; the Faust web server serves
both (streams/web.py): `curl http://127.0.0.1:$TRACETRAIN_STREAMS__WEB_PORT/metrics` and
`.../state` (JSON, what replay and the demo read)."""

from __future__ import annotations

from tracetrain.observability import Metrics, values


class StreamsMetrics:
    def __init__(self) -> None:
        m = Metrics("streams")
        self.registry = m.registry
        self.events_in = m.counter("input", "records", "Records read, per input topic.", ["topic"])
        self.duplicates = m.counter("duplicate", "records", "Records already in their rollout.",
                                    ["topic"])
        self.late = m.counter("late", "records", "Records for a closed rollout.", ["topic"])
        self.rollouts_open = m.gauge("open", "rollouts", "Open rollouts on this worker.")
        self.rollouts_closed = m.counter("closed", "rollouts",
                                         "Closed rollouts by reason (final, end, timeout).",
                                         ["reason"])
        self.val_rollouts = m.counter("val", "rollouts", "Closed rollouts with calls of `val` "
                                      "traffic (X-Rollout-Mode: val); those calls never became "
                                      "transitions.")
        self.transitions_out = m.counter("output", "transitions", "Transitions produced.")
        self.air_derived = m.counter("air_derived", "events", "AirEvents derived, per rule.",
                                     ["rule"])
        self.lag = m.gauge("lag", "records", "Records of an assigned input partition not yet "
                           "processed by this worker (-1: not known yet).", ["topic", "partition"])
        self.fetch_resumed = m.counter("fetch_resumed", "events", "Times a stalled input "
                                       "partition's fetch was resumed (see join.STALL_S).",
                                       ["topic", "partition"])
        self.dlq = m.counter("dlq", "records", "Records sent to the dead-letter topic, per reason.",
                             ["reason"])
        self.exposition = m.exposition

    def state(self) -> dict:
        """The worker's figures as plain numbers (the `/state` page): what code reads to decide,
        instead of parsing the metric text."""
        lag: dict[str, dict[str, int]] = {}
        for family in self.lag.collect():
            for sample in family.samples:
                lag.setdefault(sample.labels["topic"], {})[sample.labels["partition"]] = \
                    int(sample.value)
        return {
            "input_records": values(self.events_in, "topic"),
            "duplicate_records": values(self.duplicates, "topic"),
            "late_records": values(self.late, "topic"),
            "open_rollouts": int(values(self.rollouts_open)),
            "closed_rollouts": values(self.rollouts_closed, "reason"),
            "output_transitions": int(values(self.transitions_out)),
            "val_rollouts": int(values(self.val_rollouts)),
            "air_derived": values(self.air_derived, "rule"),
            "lag": lag,  # topic short name -> partition -> records left (-1: not known yet)
            "dlq_records": values(self.dlq, "reason"),
        }
