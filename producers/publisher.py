"""The one Kafka publisher every producer uses (gateway, tracer, OTel exporter, reward API).

    pub = Publisher(settings, name="gateway"); pub.publish_span(span); pub.close()

Writes: the spans/rewards topics of `settings.topics`, keyed by rollout_id, through an
idempotent confluent-kafka Producer (acks=all, compression/linger/batch from
`settings.publisher`); and a write-ahead spool in `$TRACETRAIN_HOME/spool/NAME/`.

The promise: every record whose `publish*()` call returned is delivered eventually, once per
process life, in per-key order, even across a broker outage or a `kill -9`. Each record is
appended to the spool (one write syscall) before it is handed to librdkafka and is
acknowledged there when its delivery report arrives. When librdkafka's queue is full the
publisher switches to spool mode: new records only go to disk, and a background thread feeds
them to Kafka in order until it has caught up. A new process replays what the last one left
unacknowledged. A `kill -9` between a delivery and its acknowledgement write can repeat that
record on replay (at-least-once across crashes); span ids let consumers drop repeats.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from functools import partial
from pathlib import Path

from confluent_kafka import KafkaException, Producer

from producers.errors import ProducerError
from producers.spool import Spool
from schemas import Codec
from tracetrain.errors import Backpressure
from tracetrain.observability import Metrics, StatusServer
from tracetrain.settings import Settings

log = logging.getLogger(__name__)

# The metrics server of a tracer or exporter process (publisher.metrics_port): one per process,
# however many publishers it holds; a process with its own web server (the gateway) exports
# each publisher's `metrics` instead.
_status: list[StatusServer] = []
_served: list[Publisher] = []
# While a caller published this recently, it serves the delivery reports (see publish()).
_CALLER_POLLS_S = 0.01
_POLL_EVERY = 32  # publishes between a caller's polls (also at least every _CALLER_POLLS_S / 2)


def serve_metrics(publisher: Publisher, port: int) -> StatusServer:
    """Serve `publisher`'s metrics (and every other publisher's of this process) on `port`:
    /metrics, /healthz, /state (records per outcome, per publisher)."""
    _served.append(publisher)
    if not _status:
        metrics = Metrics("publisher")
        _status.append(StatusServer(metrics, port=port, state=lambda: {
            "publishers": {p.name: {**p.counts, "pending": p.pending()} for p in _served}}))
    _status[0].metrics.register(publisher.metrics.registry)
    return _status[0]


def _unserve(publisher: Publisher) -> None:
    if publisher in _served:
        _served.remove(publisher)
        _status[0].metrics.registry.unregister(publisher.metrics.registry)


def producer_config(settings: Settings) -> dict:
    """The librdkafka settings shared by our publisher and the bare benchmark baseline."""
    pub = settings.publisher
    return {
        "bootstrap.servers": settings.kafka.bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": pub.compression,
        "linger.ms": pub.linger_ms,
        "batch.size": pub.batch_size,
        "queue.buffering.max.messages": pub.queue_max_messages,
        # Never give up on a record locally: an outage fills the queue, then the spool.
        "message.timeout.ms": 0,
        "reconnect.backoff.max.ms": 1000,
        "log_level": 3,
    }


class Publisher:
    """Thread-safe; one per process and spool name. Close it (or use `with`)."""

    def __init__(self, settings: Settings, name: str = "default", spool_dir: Path | None = None,
                 codec: Codec | None = None):
        self.settings = settings
        self.name = name
        self.codec = codec or Codec(registry_url=settings.schema_registry.url)
        self.topics = settings.topics
        self._max_block_s = settings.publisher.max_block_ms / 1000
        self._sync_interval_s = settings.publisher.fsync_interval_ms / 1000
        self._spool = Spool(spool_dir or settings.home_dir / "spool" / name,
                            settings.publisher.spool_segment_mb * 1024 * 1024)
        self._producer = Producer(producer_config(settings))
        self._lock = threading.Lock()  # order of spool appends == order handed to librdkafka
        self._done: deque = deque()
        self._settle_lock = threading.Lock()
        self._retry: deque = deque()
        self.counts = {"sent": 0, "failed": 0, "spooled": 0, "retried": 0}
        # Its own registry: the process that holds the publisher exports it (the gateway's
        # /metrics, or serve_metrics below for a tracer or exporter).
        self.metrics = Metrics("publisher")
        records = self.metrics.counter(
            "output", "records", "Records by outcome: sent (delivered), failed (given up), "
            "spooled (went through the disk spool), retried (re-sent after a retriable error).",
            ["publisher", "outcome"])
        self._metrics = {k: records.labels(name, k) for k in self.counts}
        self._closing = False
        self._last_publish = self._polled_at = 0.0
        self._unpolled = 0
        first = self._spool.pending_from(0, 0)
        # Records left by the previous process go first; until they are out, new ones queue.
        self._direct = first is None
        self._cursor = first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"publisher-{name}", daemon=True)
        self._thread.start()
        if settings.publisher.metrics_port is not None:
            serve_metrics(self, settings.publisher.metrics_port)

    # -- the caller's side -------------------------------------------------------------------

    def publish(self, topic: str, key: str, value: bytes) -> None:
        """Spool and send one record. Returns within max_block_ms or raises Backpressure."""
        if not self._lock.acquire(timeout=self._max_block_s):
            raise Backpressure(f"publisher {self.name} busy for over "
                               f"{self._max_block_s * 1000:.0f} ms", retry_after=self._max_block_s)
        try:
            if self._closing:
                raise ProducerError(f"publisher {self.name} is closed")
            kb, producer = key.encode(), self._producer
            sid, idx = self._spool.append(topic, kb, value)
            if self._direct:
                try:
                    producer.produce(topic, value, kb,
                                     callback=partial(self._on_delivery, sid, idx))
                except BufferError:
                    self._direct, self._cursor = False, (sid, idx)
                except KafkaException as exc:
                    self._spool.ack_many([(sid, idx)])  # permanent: never replay it
                    self._count("failed")
                    raise ProducerError(f"Kafka refused a record for {topic}: {exc}") from exc
            if not self._direct:
                self._count("spooled")
                return
            now = self._last_publish = time.monotonic()
            self._unpolled += 1
            poll = self._unpolled >= _POLL_EVERY or now - self._polled_at >= _CALLER_POLLS_S / 2
            if poll:
                self._unpolled, self._polled_at = 0, now
        finally:
            self._lock.release()
        # While callers publish, they serve the delivery reports (produce, then now and then
        # poll(0)), a batch at a time. Served by the background thread instead, each report
        # made that thread take the GIL from the caller mid-work: bench.producer went from
        # 8.0k to 9.3-9.9k spans/s once callers served them. Not on every call: that added
        # ~10 us to the median traced call (bench.tracer).
        if poll:
            producer.poll(0)

    def publish_span(self, span: dict) -> None:
        self.publish(self.topics.spans, span["rollout_id"],
                     self.codec.encode("Span", span, topic=self.topics.spans))

    def publish_reward(self, reward: dict) -> None:
        self.publish(self.topics.rewards, reward["rollout_id"],
                     self.codec.encode("Reward", reward, topic=self.topics.rewards))

    def pending(self) -> int:
        """Records not yet acknowledged by the broker (in librdkafka or on disk)."""
        return self._spool.unacked()

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait until everything published so far is delivered; returns what is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            queued = self._producer.flush(min(0.1, max(0.0, deadline - time.monotonic())))
            # Settled here rather than left to the background thread's next turn (up to
            # _CALLER_POLLS_S later), so a flush returns as soon as Kafka has everything.
            self._settle()
            if self._direct and queued == 0 and not self._retry and self._spool.unacked() == 0:
                return 0
            if time.monotonic() >= deadline:
                return self._spool.unacked()
            if not self._direct:
                time.sleep(0.01)  # the background thread is feeding the spool to Kafka

    def close(self, timeout_s: float = 30.0) -> int:
        """Flush, then stop; what is still undelivered stays in the spool for the next start."""
        left = self.flush(timeout_s)
        with self._lock:
            self._closing = True
        self._stop.set()
        self._thread.join(timeout=5)
        _unserve(self)
        self._spool.close()
        # Drop librdkafka now (not at garbage collection) so it stops reconnecting; whatever
        # it still held is in the spool for the next start.
        self._producer.purge()
        self._producer.flush(0)
        self._producer = None
        return left

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the background thread -----------------------------------------------------------------

    def _count(self, outcome: str, n: int = 1) -> None:
        self.counts[outcome] += n
        self._metrics[outcome].inc(n)

    def _on_delivery(self, sid: int, idx: int, err, msg) -> None:
        if err is not None and self._closing:
            return  # purged at close: it stays in the spool for the next start
        if err is None:
            self._done.append((sid, idx, True))
        elif err.retriable() and not err.fatal():
            self._retry.append((sid, idx))
        else:
            log.error("publisher %s: record lost for %s: %s", self.name, msg.topic(), err)
            self._done.append((sid, idx, False))

    def _run(self) -> None:
        last_sync = time.monotonic()
        while not self._stop.is_set():
            if not self._direct:
                self._producer.poll(0.0)
            elif time.monotonic() - self._last_publish > _CALLER_POLLS_S:
                self._producer.poll(_CALLER_POLLS_S)  # callers idle: serve the reports here
            else:
                self._stop.wait(_CALLER_POLLS_S)
            self._settle()
            if not self._direct:
                self._drain_step()
            now = time.monotonic()
            if now - last_sync >= self._sync_interval_s:
                self._spool.sync()
                last_sync = now
        self._producer.poll(0)
        self._settle()

    def _settle(self) -> None:
        with self._settle_lock:  # the background thread and flush()
            self._settle_unlocked()

    def _settle_unlocked(self) -> None:
        done = []
        sent = failed = 0
        while self._done:
            sid, idx, ok = self._done.popleft()
            done.append((sid, idx))
            sent, failed = sent + ok, failed + (not ok)
        if done:
            self._spool.ack_many(done)
            self._count("sent", sent) if sent else None
            self._count("failed", failed) if failed else None
        while self._retry:
            sid, idx = self._retry[0]
            rec = self._spool.read(sid, idx)
            try:
                self._producer.produce(rec.topic, rec.value, rec.key,
                                       callback=partial(self._on_delivery, sid, idx))
            except BufferError:
                return
            self._retry.popleft()
            self._count("retried")

    def _drain_step(self, batch: int = 5000) -> None:
        """Feed spooled records to librdkafka in order; back to direct mode once caught up."""
        for _ in range(batch):
            pos = self._spool.pending_from(*self._cursor)
            if pos is None:
                with self._lock:
                    pos = self._spool.pending_from(*self._cursor)
                    if pos is None:
                        self._direct = True
                        return
            rec = self._spool.read(*pos)
            try:
                self._producer.produce(rec.topic, rec.value, rec.key,
                                       callback=partial(self._on_delivery, *pos))
            except BufferError:
                time.sleep(0.01)
                return
            self._cursor = (pos[0], pos[1] + 1)
