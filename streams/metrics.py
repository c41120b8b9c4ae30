"""Prometheus metrics of a streams worker, served by the Faust web server at /metrics
(`curl http://127.0.0.1:$TRACETRAIN_STREAMS__WEB_PORT/metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class StreamsMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events_in = Counter("tracetrain_streams_events_in", "Records read, per input topic.",
                                 ["topic"], registry=r)
        self.duplicates = Counter("tracetrain_streams_duplicates", "Records already in their rollout.",
                                  ["topic"], registry=r)
        self.late = Counter("tracetrain_streams_late_events", "Records for a closed rollout.",
                            ["topic"], registry=r)
        self.rollouts_open = Gauge("tracetrain_streams_rollouts_open", "Open rollouts on this worker.",
                                   registry=r)
        self.rollouts_closed = Counter("tracetrain_streams_rollouts_closed",
                                       "Closed rollouts by reason (final, end, timeout).", ["reason"],
                                       registry=r)
        self.transitions_out = Counter("tracetrain_streams_transitions_out", "Transitions produced.",
                                       registry=r)
        self.air_derived = Counter("tracetrain_streams_air_derived", "AirEvents derived, per rule.",
                                   ["rule"], registry=r)
        self.lag = Gauge("tracetrain_streams_lag", "Records of an assigned input partition not yet "
                         "processed by this worker (-1: not known yet).", ["topic", "partition"],
                         registry=r)
        self.fetch_resumed = Counter("tracetrain_streams_fetch_resumed", "Times a stalled input "
                                     "partition's fetch was resumed (see join.STALL_S).",
                                     ["topic", "partition"], registry=r)
        self.dlq = Counter("tracetrain_streams_dlq", "Records sent to the dead-letter topic, per reason.",
                           ["reason"], registry=r)
