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

What cannot be kept is refused before it is promised: a record larger than Kafka takes
(producers.limits) goes to the spool's dead-letter file (producers.dead_letters), counted, and
a full spool or disk raises `SpoolFull` (a Backpressure: the gateway answers 503). A delivery
error (a missing topic, a producer failure that librdkafka calls fatal, a batch the broker
refuses) loses nothing: the publisher goes to spool mode, drops its producer, waits
(retry_backoff_ms, doubling), makes a new one and sends every unacknowledged record again in
spool order, which keeps per-key order. The delivery thread is supervised: an unexpected
exception is logged, counted and followed by the same recovery. Its state is `health()`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from functools import partial
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Producer

from producers.dead_letters import DeadLetterFile
from producers.errors import ProducerError, RecordTooLarge, SpoolFull
from producers.limits import RecordLimits
from producers.spool import Record, Spool
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
OUTCOMES = ("sent", "spooled", "retried", "dead_lettered", "refused")
STATES = ("running", "retrying", "restarting", "stopped")
# Reports of records we purged ourselves (at close, or to start again): they stay spooled.
_PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)
# Before a restart, records already sent get this long for the broker's answer, so that one
# it took is not sent a second time.
_IN_FLIGHT_GRACE_S = 2.0
_LIMITS_EVERY_S = 60.0  # asking the broker again for topic limits it did not give yet
_LIMITS_TIMEOUT_S = 3.0


def serve_metrics(publisher: Publisher, port: int) -> StatusServer:
    """Serve `publisher`'s metrics (and every other publisher's of this process) on `port`:
    /metrics, /healthz, /state (records per outcome and delivery health, per publisher)."""
    _served.append(publisher)
    if not _status:
        metrics = Metrics("publisher")
        _status.append(StatusServer(metrics, port=port, state=lambda: {
            "publishers": {p.name: {**p.counts, "pending": p.pending(), **p.health()}
                           for p in _served}}))
    _status[0].metrics.register(publisher.metrics.registry)
    return _status[0]


def _unserve(publisher: Publisher) -> None:
    if publisher in _served:
        _served.remove(publisher)
        _status[0].metrics.registry.unregister(publisher.metrics.registry)


# Extra librdkafka properties that also reach the admin client reading topic limits: how to
# connect. Others (a producer's, like linger.ms) would make it refuse to start.
_CONNECTION = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.", "reconnect.")


def admin_config(settings: Settings) -> dict:
    """What an admin client of the publisher's cluster needs: its address, how to connect."""
    extra = settings.publisher.librdkafka
    return {"bootstrap.servers": settings.kafka.bootstrap_servers,
            **{k: v for k, v in extra.items() if k.startswith(_CONNECTION)}}


def producer_config(settings: Settings, message_max: int | None = None) -> dict:
    """The librdkafka settings shared by our publisher and the bare benchmark baseline."""
    pub = settings.publisher
    message_max = message_max or pub.message_max_bytes
    return {
        "bootstrap.servers": settings.kafka.bootstrap_servers,
        **pub.librdkafka,
        "enable.idempotence": True,
        # Without it, a batch the broker refuses for good (a topic's limit lowered) is failed
        # while later batches of its partition are still delivered, so the refused batch's
        # records, sent again, would land after them. With it, that refusal is a fatal error:
        # nothing after the gap goes out, and what a partition took stays a prefix of the
        # spool, which the restart in _start_producer relies on.
        "enable.gapless.guarantee": True,
        "acks": "all",
        # One request in flight per broker. With more, a batch refused as not persisted (a
        # partition whose leader is not ready yet, just after the topic was created) could be
        # followed by a later batch that the broker takes as a new producer's first: librdkafka
        # then counts the refused batch as "implicitly acked by subsequent batch success" and
        # reports it delivered, so the spool let go of records Kafka never held (seen in about
        # 1 run in 10 of the full-spool test, with librdkafka's msg,eos debug log).
        "max.in.flight.requests.per.connection": 1,
        "compression.type": pub.compression,
        "linger.ms": pub.linger_ms,
        "batch.size": min(pub.batch_size, message_max),
        "message.max.bytes": message_max,
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
        pub = settings.publisher
        self.settings = settings
        self.name = name
        self.codec = codec or Codec(registry_url=settings.schema_registry.url)
        self.topics = settings.topics
        self._max_block_s = pub.max_block_ms / 1000
        self._sync_interval_s = pub.fsync_interval_ms / 1000
        self._backoff_s = self._first_backoff_s = pub.retry_backoff_ms / 1000
        self._max_backoff_s = pub.retry_backoff_max_ms / 1000
        folder = Path(spool_dir or settings.home_dir / "spool" / name)
        self._init_metrics()
        self._spool = Spool(folder, pub.spool_segment_mb * 1024 * 1024,
                            max_bytes=pub.spool_max_mb * 1024 * 1024,
                            retry_after_s=pub.spool_full_retry_after_s,
                            on_quarantine=self._quarantined.inc)
        self._dead = DeadLetterFile(folder / "dead-letters.log", pub.spool_full_retry_after_s)
        self._limits = RecordLimits(admin_config(settings), pub.message_max_bytes,
                                    [self.topics.spans, self.topics.rewards])
        self._producer = self._new_producer()
        self._lock = threading.Lock()  # order of spool appends == order handed to librdkafka
        self._done: deque = deque()  # (segment, index) of delivered records
        self._held: deque = deque()  # (topic, KafkaError) of records Kafka did not take
        self._settle_lock = threading.Lock()
        # (error name, message) of what makes the delivery thread start again from the spool
        self._trouble: tuple[str, str] | None = None
        self._state, self._error, self._restarts = "running", None, 0
        self._set_state("running")
        self._mark = (0, 0)  # records before this position waited through the last trouble
        self._closing = False
        self._last_publish = self._polled_at = 0.0
        self._unpolled = 0
        first = self._spool.pending_from(0, 0)
        # Records left by the previous process go first; until they are out, new ones queue.
        self._direct = first is None
        self._cursor = first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name=f"publisher-{name}",
                                        daemon=True)
        self._thread.start()
        if pub.metrics_port is not None:
            serve_metrics(self, pub.metrics_port)

    def _init_metrics(self) -> None:
        # Its own registry: the process that holds the publisher exports it (the gateway's
        # /metrics, or serve_metrics above for a tracer or exporter).
        self.metrics = m = Metrics("publisher")
        self.counts = dict.fromkeys(OUTCOMES, 0)
        records = m.counter(
            "output", "records", "Records by outcome: sent (delivered), spooled (went through "
            "the disk spool), retried (sent again after a delivery error), dead_lettered (larger "
            "than Kafka takes: in the spool's dead-letter file), refused (spool or disk full).",
            ["publisher", "outcome"])
        self._metrics = {k: records.labels(self.name, k) for k in OUTCOMES}
        self._quarantined = m.counter(
            "quarantined", "bytes", "Spool bytes found damaged (not a record), moved to the "
            "spool's quarantine/ folder.", ["publisher"]).labels(self.name)
        self._errors = m.counter(
            "delivery_errors", "events", "Delivery errors that made the publisher send its "
            "spool again (by Kafka error name; 'exception' for a failure of its own).",
            ["publisher", "error"])
        self._state_gauge = m.gauge(
            "delivery_state", "value", "1 for the delivery thread's current state: running, "
            "retrying (after a delivery error), restarting (after a failure), stopped.",
            ["publisher", "state"])
        spool_bytes = m.gauge("spool", "bytes", "Bytes in the spool's segments.", ["publisher"])
        spool_bytes.labels(self.name).set_function(lambda: self._spool.bytes)
        m.gauge("spool_limit", "bytes", "The spool's size limit (publisher.spool_max_mb).",
                ["publisher"]).labels(self.name).set_function(lambda: self._spool.max_bytes)

    # -- the caller's side -------------------------------------------------------------------

    def publish(self, topic: str, key: str, value: bytes) -> None:
        """Spool and send one record. Returns within max_block_ms or raises Backpressure
        (SpoolFull when the spool or its disk has no room). A record larger than Kafka takes
        is moved to the dead-letter file instead (counted, logged)."""
        if not self._lock.acquire(timeout=self._max_block_s):
            raise Backpressure(f"publisher {self.name} busy for over "
                               f"{self._max_block_s * 1000:.0f} ms", retry_after=self._max_block_s)
        try:
            if self._closing:
                raise ProducerError(f"publisher {self.name} is closed")
            kb, producer = key.encode(), self._producer
            try:
                if len(kb) + len(value) > self._limits.record_limit:
                    self._dead_letter(topic, kb, value)
                    return
                sid, idx = self._spool.append(topic, kb, value)
            except SpoolFull:
                self._count("refused")
                raise
            if self._direct:
                try:
                    producer.produce(topic, value, kb,
                                     callback=partial(self._on_delivery, sid, idx))
                except (BufferError, KafkaException):
                    # Queue full, or a producer that failed: the record is spooled; the
                    # delivery thread sends it (and deals with the failure) from here.
                    self._direct, self._cursor = False, (sid, idx)
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
            self._poll(producer, 0)

    def publish_span(self, span: dict) -> None:
        self.publish(self.topics.spans, span["rollout_id"],
                     self.codec.encode("Span", span, topic=self.topics.spans))

    def publish_reward(self, reward: dict) -> None:
        self.publish(self.topics.rewards, reward["rollout_id"],
                     self.codec.encode("Reward", reward, topic=self.topics.rewards))

    def admit(self, topic: str, nbytes: int) -> None:
        """Raise now what publishing a record of at least `nbytes` (key + value) for `topic`
        would: RecordTooLarge past Kafka's limit, SpoolFull when the spool could not keep it.
        For a caller about to do work whose record must be kept (the gateway, before it
        calls the upstream)."""
        limit = self._limits.record_limit
        if nbytes > limit:
            raise RecordTooLarge(
                f"the record of this call ({nbytes} bytes or more) would exceed {limit} bytes, "
                f"the largest record Kafka takes for {topic} (publisher.message_max_bytes and "
                "the topic's max.message.bytes)", limit=limit)
        try:
            self._spool.check_room(nbytes)
        except SpoolFull:
            self._count("refused")
            raise

    def pending(self) -> int:
        """Records not yet acknowledged by the broker (in librdkafka or on disk)."""
        return self._spool.unacked()

    def health(self) -> dict:
        """The delivery thread's state and the spool's room, for /healthz and /state."""
        spool = self._spool
        no_room = spool.no_room_since is not None
        full = spool.bytes + self._limits.record_limit > spool.max_bytes
        return {
            "ok": self._state == "running" and self._thread.is_alive() and not no_room,
            "delivery": {"state": self._state, "alive": self._thread.is_alive(),
                         "error": self._error, "restarts": self._restarts,
                         "record_limit_bytes": self._limits.record_limit,
                         "topic_limits": dict(self._limits.topic_max)},
            "spool": {"bytes": spool.bytes, "limit_bytes": spool.max_bytes, "nearly_full": full,
                      "disk_full": no_room, "dead_letters": self._dead.next_index,
                      "quarantined_bytes": spool.quarantined_bytes},
        }

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait until everything published so far is delivered; returns what is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                queued = self._producer.flush(min(0.1, max(0.0, deadline - time.monotonic())))
            except KafkaException as exc:  # a fatal producer error: the thread starts again
                self._trouble, queued = (exc.args[0].name(), exc.args[0].str()), -1
            # Settled here rather than left to the background thread's next turn (up to
            # _CALLER_POLLS_S later), so a flush returns as soon as Kafka has everything.
            self._settle()
            if self._direct and queued == 0 and self._spool.unacked() == 0:
                return 0
            if time.monotonic() >= deadline:
                return self._spool.unacked()
            if not self._direct or queued < 0:
                time.sleep(0.01)  # the background thread is feeding the spool to Kafka

    def close(self, timeout_s: float = 30.0) -> int:
        """Flush, then stop; what is still undelivered stays in the spool for the next start."""
        left = self.flush(timeout_s)
        with self._lock:
            self._closing = True
        self._stop.set()
        self._thread.join(timeout=_IN_FLIGHT_GRACE_S + 5)
        _unserve(self)
        self._spool.close()
        # Drop librdkafka now (not at garbage collection) so it stops reconnecting; whatever
        # it still held is in the spool for the next start.
        self._producer.purge()
        self._producer.flush(0)
        self._producer = None
        self._set_state("stopped")
        return left

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- shared by both sides --------------------------------------------------------------

    def _count(self, outcome: str, n: int = 1) -> None:
        self.counts[outcome] += n
        self._metrics[outcome].inc(n)

    def _poll(self, producer: Producer, timeout: float) -> None:
        try:
            producer.poll(timeout)
        except KafkaException as exc:  # librdkafka raises its fatal errors from poll
            self._trouble = (exc.args[0].name(), exc.args[0].str())

    def _dead_letter(self, topic: str, key: bytes, value: bytes,
                     spooled: Record | None = None) -> None:
        """Move a record Kafka will not take to the dead-letter file (SpoolFull: no room)."""
        limit = self._limits.record_limit
        reason = (f"record_too_large: {len(key) + len(value)} bytes (key + value) exceed "
                  f"{limit}, the largest record Kafka takes for {topic} "
                  "(publisher.message_max_bytes and the topic's max.message.bytes)")
        self._dead.append(reason, topic, key, value)
        if spooled is not None:
            self._spool.ack_many([(spooled.segment, spooled.index)])
        self._count("dead_lettered")
        log.warning("publisher %s: %s; moved to %s", self.name, reason, self._dead.path)

    def _on_delivery(self, sid: int, idx: int, err, msg) -> None:
        if err is None:
            self._done.append((sid, idx))
        elif err.code() not in _PURGED:
            self._held.append((msg.topic(), err))

    def _settle(self) -> None:
        with self._settle_lock:  # the background thread and flush()
            done = []
            while self._done:
                done.append(self._done.popleft())
            if done:
                self._spool.ack_many(done)
                self._count("sent", len(done))
                if self._state != "running":
                    first = self._spool.pending_from(0, 0)
                    if first is None or first >= self._mark:  # what waited through it is out
                        self._set_state("running")
                        self._backoff_s = self._first_backoff_s

    def _set_state(self, state: str, error: str | None = None) -> None:
        self._state, self._error = state, error
        for s in STATES:
            self._state_gauge.labels(self.name, s).set(1 if s == state else 0)

    # -- the background thread -----------------------------------------------------------------

    def _supervise(self) -> None:
        """Run the delivery loop; an exception it did not expect is logged, counted, and
        followed by a fresh start from the spool (a thread that died would deliver nothing
        more, while publish() went on promising)."""
        while not self._stop.is_set():
            try:
                self._deliver()
            except Exception as exc:  # noqa: BLE001 (any failure: restart, never die silently)
                log.exception("publisher %s: delivery thread failed; starting it again",
                              self.name)
                self._restarts += 1
                self._trouble = ("exception", f"{type(exc).__name__}: {exc}")
                self._set_state("restarting", self._trouble[1])
        self._poll(self._producer, 0)
        self._settle()

    def _deliver(self) -> None:
        last_sync = time.monotonic()
        limits_at = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if self._trouble is not None:
                self._recover()
                continue
            if not self._limits.known() and now - limits_at >= _LIMITS_EVERY_S:
                limits_at = now
                self._refresh_limits()
            if not self._direct:
                self._poll(self._producer, 0.0)
            elif now - self._last_publish > _CALLER_POLLS_S:
                self._poll(self._producer, _CALLER_POLLS_S)  # callers idle: serve reports here
            else:
                self._stop.wait(_CALLER_POLLS_S)
            self._settle()
            if self._held:
                topic, err = self._held[0]
                self._trouble = (err.name(), f"{topic}: {err.str()}")
                self._limits.topics.add(topic)
            elif not self._direct:
                self._drain_step()
            if now - last_sync >= self._sync_interval_s:
                self._spool.sync()
                last_sync = now

    def _refresh_limits(self) -> None:
        """Read the topics' limits; a producer made for larger records is replaced (what it
        held is sent again by the next one)."""
        self._limits.refresh(_LIMITS_TIMEOUT_S, self._stop)
        if self._limits.outdated():
            log.info("publisher %s: a topic takes records of at most %d bytes; making a "
                     "producer for them", self.name, self._limits.message_max())
            self._restart_producer()

    def _recover(self) -> None:
        """After a delivery error or a failure: stop the producer, wait, make a new one, and
        send every unacknowledged record again in spool order."""
        name, message = self._trouble
        self._errors.labels(self.name, name).inc()
        if self._state != "restarting":
            self._set_state("retrying", message)
        log.warning("publisher %s: %s; its records stay spooled and are sent again in %.1f s",
                    self.name, message, self._backoff_s)
        self._stop_producer()
        self._stop.wait(self._backoff_s)
        self._backoff_s = min(self._backoff_s * 2, self._max_backoff_s)
        # A refused batch (or a fatal error following one) may mean a topic's limit was
        # lowered: the next producer is made for the limits as they are now.
        self._limits.refresh(_LIMITS_TIMEOUT_S, self._stop)
        self._trouble = None
        self._start_producer()

    def _restart_producer(self) -> None:
        self._stop_producer()
        self._start_producer()

    def _stop_producer(self) -> None:
        with self._lock:
            self._direct = False  # callers only spool from here on
        old = self._producer
        old.purge(in_queue=True, in_flight=False)  # never sent: reported purged, still spooled
        try:
            old.flush(_IN_FLIGHT_GRACE_S)
        except KafkaException:
            pass  # a fatal error: nothing more will be reported
        old.purge()  # still in flight after the grace: sent again (at least once)
        self._poll(old, 0)
        self._settle()
        self._held.clear()

    def _start_producer(self) -> None:
        self._producer = self._new_producer()
        # Everything unacknowledged goes again, in spool order: per-key order holds, since
        # what a partition took before the trouble is a prefix of what was sent to it.
        self._mark = (self._spool.current.id, self._spool.current.written)
        self._cursor = (0, 0)
        self._count("retried", self._spool.unacked())

    def _new_producer(self) -> Producer:
        message_max = self._limits.message_max()
        producer = Producer(producer_config(self.settings, message_max))
        self._limits.use(message_max)
        return producer

    def _drain_step(self, batch: int = 5000) -> None:
        """Feed spooled records to librdkafka in order; back to direct mode once caught up."""
        producer = self._producer
        for _ in range(batch):
            pos = self._spool.pending_from(*self._cursor)
            if pos is None:
                with self._lock:
                    pos = self._spool.pending_from(*self._cursor)
                    if pos is None:
                        self._direct = True
                        return
            rec = self._spool.read(*pos)
            if rec is not None and not self._send(producer, rec):
                return
            self._cursor = (pos[0], pos[1] + 1)

    def _send(self, producer: Producer, rec: Record) -> bool:
        """Hand one spooled record to librdkafka (or to the dead-letter file); False when the
        drain must pause here (queue full, no room, or a failed producer)."""
        too_large = len(rec.key) + len(rec.value) > self._limits.record_limit
        if not too_large:
            try:
                producer.produce(rec.topic, rec.value, rec.key,
                                 callback=partial(self._on_delivery, rec.segment, rec.index))
                return True
            except BufferError:
                time.sleep(0.01)
                return False
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() != KafkaError.MSG_SIZE_TOO_LARGE:  # else librdkafka's count wins
                    self._trouble = (err.name(), f"{rec.topic}: {err.str()}")
                    return False
        try:
            self._dead_letter(rec.topic, rec.key, rec.value, spooled=rec)
            return True
        except SpoolFull as exc:  # no room for the letter either: try again in a while
            log.warning("publisher %s: %s", self.name, exc)
            self._stop.wait(exc.retry_after)
            return False
