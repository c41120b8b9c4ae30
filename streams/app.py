"""The Faust app: AIR deriver, rollout join, credit assignment, dead-letter routing.

    tracetrain streams [--max-seconds N]        (or: python -m streams)

Reads `settings.topics.spans`, `.rewards`, `.air` (co-partitioned, keyed by rollout_id, Avro
values decoded by `schemas.Codec`); writes `.transitions`, `.air` (derived AirEvents), `.dlq`
and the table changelog `<group>-rollouts-changelog`. Several workers with the same settings
form one consumer group and share the partitions; a restarted or rebalanced worker recovers
the rollouts from the changelog. At-least-once (Faust's exactly_once mode is not used:
faust-streaming issues 517, 323); transitions have deterministic ids, so a crash can
duplicate one but never lose or alter it. Metrics: http://WEB_HOST:WEB_PORT/metrics.
"""

from __future__ import annotations

import logging

import faust

from infra.topics import planned_partitions
from streams.dlq import DeadLetters
from streams.join import Join
from streams.metrics import StreamsMetrics
from streams.transport import App
from streams.web import add_pages
from tracetrain.settings import Settings

log = logging.getLogger(__name__)
RAW = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}


class Worker(faust.Worker):
    """Faust's worker without its terminal spinner. The spinner's log handler sets the root
    logger to DEBUG (so that every record spins it): aiokafka and Faust then build a debug
    record for every message sent, about 6% of a loaded worker's time (py-spy)."""

    def on_setup_root_logger(self, logger, level: int) -> None:
        self.spinner = None


def faust_app(settings: Settings, app_id: str, **extra) -> App:
    """A Faust app on the settings' cluster; state under `home/streams/<app_id>-<web port>`."""
    s = settings.streams
    partitions = planned_partitions(settings.topics)["spans"]
    datadir = settings.home_dir / "streams" / f"{app_id}-{s.web_port}"
    datadir.parent.mkdir(parents=True, exist_ok=True)  # Faust creates only the last level
    return App(
        app_id, fetch_max_wait_ms=s.fetch_max_wait_ms,
        broker=[f"kafka://{server}" for server in settings.kafka.bootstrap_servers.split(",")],
        datadir=str(datadir), store="memory://", autodiscover=False,
        web_host=s.web_host, web_port=s.web_port, web_enabled=True, web_in_thread=False,
        topic_partitions=partitions, topic_replication_factor=settings.topics.replication,
        table_standby_replicas=0, consumer_auto_offset_reset="earliest",
        broker_session_timeout=s.session_timeout_s,
        broker_heartbeat_interval=min(3.0, s.session_timeout_s / 3),
        producer_acks=-1, producer_linger_ms=5, processing_guarantee="at_least_once",
        producer_max_request_size=s.max_record_bytes,
        **extra,
    )


def create_app(settings: Settings) -> tuple[App, Join]:
    topics, cfg = settings.topics, settings.streams
    app = faust_app(settings, cfg.group_id(topics.prefix))
    metrics = StreamsMetrics()
    spans = app.topic(topics.spans, **RAW)
    rewards = app.topic(topics.rewards, **RAW)
    air = app.topic(topics.air, **RAW)
    dlq = DeadLetters(app.topic(topics.dlq, **RAW), metrics, cfg.max_record_bytes)
    table = app.Table("rollouts", default=None, partitions=planned_partitions(topics)["spans"],
                      key_type=bytes, value_type=bytes)  # bytes: Faust uses the raw codec
    join = Join(settings, table, dlq, metrics)

    @app.agent(spans, name="join_spans")
    async def join_spans(stream):
        """AIR deriver and span join in one agent, so each span is decoded once: the join
        applies the derived AirEvents at once and publishes them on the air topic, in the
        span's own partition (co-partitioned whatever partitioner the producers use).
        Sent now, not at the next commit: closes wait for the air partition to be
        read past their final reward, and these records are most of what it holds. A crash
        re-derives them; the join ignores derived AirEvents it reads, so copies are harmless."""
        async for event in stream.events():
            for record in await join.on_span(event):
                metrics.air_derived.labels(rule=record["rule"]).inc()
                await join.publish_air(record, event.message.partition)

    @app.agent(rewards, name="join_rewards")
    async def join_rewards(stream):
        async for event in stream.events():
            await join.on_reward(event)

    @app.agent(air, name="join_air")
    async def join_air(stream):
        async for event in stream.events():
            await join.on_air(event)

    @app.timer(cfg.timer_interval_s)
    async def close_rollouts():
        if app.in_recovery or app.rebalancing or not app.tables.recovery.completed.is_set():
            return
        assigned = frozenset(tp.partition for tp in app.consumer.assignment() if tp.topic == topics.spans)
        await join.tick(assigned)
        await join.resume_stalled(app.consumer)

    @app.on_partitions_revoked.connect
    async def on_revoked(app, revoked, **kwargs):
        join.on_revoked()

    @app.on_before_shutdown.connect
    async def on_shutdown(app, **kwargs):
        await join.shutdown()

    add_pages(app, metrics)  # /metrics, /state, /healthz

    return app, join


def run_worker(settings: Settings, max_seconds: float | None = None, loglevel: str = "WARNING") -> None:
    """Run a real Faust worker until stopped (SIGTERM/SIGINT) or for `max_seconds`."""
    import os
    import signal
    import threading

    app, _ = create_app(settings)
    if max_seconds is not None:
        # SIGTERM lets Faust's worker stop cleanly (commit, close) exactly as `kill` would.
        timer = threading.Timer(max_seconds, os.kill, args=(os.getpid(), signal.SIGTERM))
        timer.daemon = True
        timer.start()
    worker = Worker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
