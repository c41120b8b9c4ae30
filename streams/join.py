"""The rollout join's Faust adapter, run by the agents and the timer of `streams/app.py`: it
decodes each record (bad ones to the DLQ), hands it to the join core, and writes what the core
decides: table entries, transitions, derived AirEvents, dead letters. Reads spans, rewards,
air; writes transitions, air, dlq and the table's changelog. The decisions live apart, in plain
Python that tests call directly: `streams/join_core.py` (events, the rollout store, which
rollouts close), `streams/close_rules.py` (when one closes, what closing writes),
`streams/positions.py` (read positions, lag, stalls); `streams/rollout.py` is one rollout.

The table holds, per rollout_id, the rollout's state without its token lists
(`Rollout.to_bytes(with_calls=False)`, small, rewritten on every event) and, under
`call_key(rollout_id, span_id)`, each kept call once: an event costs what it adds, not the
whole rollout again. A decoded copy of this worker's rollouts is cached (rebuilt from the
table after a rebalance).

Every record the join writes (table changelog, transitions, derived AirEvents) is handed
straight to Faust's Kafka producer (`_send`), the table's local data updated alongside, not
through Faust's topic channels and producer buffer: those cost more CPU per record than the
join itself (bench.streams: 738 against 364-408 us of worker CPU per span). At-least-once holds as
before: each send is awaited, i.e. in the producer before the event's processing ends, and
Faust flushes that producer before it commits offsets; a record Kafka fails for good stops the
worker at once (`stop_now`), so no offset past it is committed, and its supervisor restarts it.
No record is larger than `streams.max_record_bytes`: a rollout whose state would outgrow it
closes at once (`_close_now`), a call or dead letter that would is dead-lettered without it.

Closing never waits inside an agent: a close sends its transitions at once, and is recorded
in the changelog (a small tombstone) by the timer only once Kafka has acknowledged all of
them, so a crash in between re-emits identical transitions instead of losing them. The timer
does little per tick: it checks the rollouts that wait on a final reward or end marker, the
other open ones (time-outs) once a second, expires tombstones oldest first, and hands the
event loop back to the agents every few milliseconds while it closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from aiokafka.errors import KafkaError
from faust.types import TP

from schemas import Codec, CodecError
from streams.close_rules import OVERSIZE, plan_close
from streams.dlq import DeadLetters
from streams.join_core import LATE_CALL, Applied, RolloutJoin, call_key, record_problem
from streams.metrics import StreamsMetrics
from streams.offsets import Offsets
from streams.positions import INPUTS, STALL_S
from streams.retokenize import Retokenizer
from streams.rollout import DUPLICATE, LATE, Rollout
from tracetrain.records import AirEvent
from tracetrain.settings import Settings

SLICE_S = 0.01  # while closing, the timer lets the agents run at least this often
# Header of the AirEvents this worker derives (they are most of what the air topic holds),
# as aiokafka hands headers over: one (name, bytes) pair of a sequence.
DERIVED = ("tracetrain-source", b"derived")
log = logging.getLogger(__name__)


def stop_now(exc: BaseException) -> None:
    """A send failed for good (after the producer's own retries, `producer_request_timeout`):
    exit before Faust commits an offset past the lost record (a clean stop would commit).
    Whoever started the worker starts it again (`tracetrain up`: infra/supervise.py), and the
    restart reads those events again. Records Kafka would refuse for their size are never sent:
    the join caps what it stores and dead-letters the rest (`streams.max_record_bytes`)."""
    log.critical("Kafka did not take a record the join wrote (%r); stopping at once so that "
                 "no offset past it is committed: a restarted worker reads those events again", exc)
    os._exit(70)


class Join:
    """The Faust adapter of the rollout join: decodes records, hands them to the core
    (`RolloutJoin`, which decides), and writes what it decides through Faust's producer (table
    changelog, transitions, derived AirEvents) and the DLQ; asks the broker for offsets;
    resumes stalled partitions. Holds no decisions of its own."""

    def __init__(self, settings: Settings, table: Any, dlq: DeadLetters, metrics: StreamsMetrics,
                 on_send_failure: Callable[[BaseException], None] = stop_now):
        self.cfg, self.topics = settings.streams, settings.topics
        self.table, self.dlq, self.metrics = table, dlq, metrics
        self.on_send_failure = on_send_failure
        self.codec = Codec(registry_url=settings.schema_registry.url)
        self.core = RolloutJoin(self.cfg, load=self._load, max_reward=settings.rewards.max_abs,
                                retokenize=Retokenizer.from_settings(settings))
        self.positions = self.core.positions
        # closes (and late calls) sent but not yet in the changelog: (send futures, key, the
        # tombstone as it stood when they were sent, its partition, kept span ids to delete).
        # A snapshot, not the live state: that may already name a late call Kafka has not
        # acknowledged, whose transition a crash would then lose.
        self.unrecorded: list[tuple[list, bytes, bytes, int, list[str]]] = []
        self.assigned: frozenset[int] | None = None
        self.offsets = Offsets(settings.kafka.bootstrap_servers,
                               self.cfg.group_id(settings.topics.prefix))
        self._last_full_scan = 0.0
        self.topic_short = {self.topics.spans: "spans", self.topics.rewards: "rewards",
                            self.topics.air: "air"}

    # -- per record -------------------------------------------------------------------------

    def _position(self, event: Any) -> tuple[str, int]:
        """Count a record read and advance its partition's read position; (topic, ts_ns)."""
        msg = event.message
        short = self.topic_short.get(msg.topic, msg.topic)
        ts_ns = int(msg.timestamp * 1e9)
        self.metrics.events_in.labels(topic=short).inc()
        self.positions.read(short, msg.partition, msg.offset, ts_ns, time.time())
        return short, ts_ns

    async def _decode(self, event: Any, name: str) -> tuple[dict | None, str, int, int]:
        msg = event.message
        short, ts_ns = self._position(event)
        try:
            record = self.codec.decode(event.value, name)
        except CodecError as exc:
            await self._dead(event, exc.reason, str(exc))
            return None, short, msg.partition, ts_ns
        problem = record_problem(event.key, record, self.core.max_reward)
        if problem is not None:
            await self._dead(event, *problem)
            return None, short, msg.partition, ts_ns
        return record, short, msg.partition, ts_ns

    async def _dead(self, event: Any, reason: str, detail: str) -> None:
        msg = event.message
        await self.dlq.send(event.key, event.value, source_topic=msg.topic, partition=msg.partition,
                            offset=msg.offset, reason=reason, detail=detail)

    def _load(self, key: bytes, partition: int) -> Rollout | None:
        raw = self.table.data.get(key)
        return self._restore(key, raw) if raw else None

    def _restore(self, key: bytes, raw: bytes) -> Rollout:
        starts = json.loads(raw)["starts"]
        calls = {span_id: self.table.data.get(call_key(key, span_id)) for span_id in starts}
        return Rollout.from_bytes(raw, {s: c for s, c in calls.items() if c is not None})

    async def _applied(self, event: Any, short: str, applied: Applied) -> bool:
        """Count and dead-letter what the core decided for this event; True if it changed
        its rollout (then the change is written and the rollout maybe closed)."""
        if applied.outcome == DUPLICATE:
            self.metrics.duplicates.labels(topic=short).inc()
        elif applied.outcome in (LATE, LATE_CALL):
            self.metrics.late.labels(topic=short).inc()
        if applied.late:
            await self._emit_late(applied.key, applied.state, applied.late)
        for reason, detail in applied.dead:
            await self._dead(event, reason, detail)
        if applied.changed:
            await self._after_event(applied)
        return applied.changed

    async def on_span(self, event: Any) -> list[AirEvent]:
        """Join one span; returns the AirEvents derived from it (for the air topic)."""
        span, short, partition, ts_ns = await self._decode(event, "Span")
        if span is None:
            return []
        applied = self.core.span(span, partition, ts_ns, time.time())
        return applied.derived if await self._applied(event, short, applied) else []

    async def on_reward(self, event: Any) -> None:
        reward, short, partition, ts_ns = await self._decode(event, "Reward")
        if reward is not None:
            await self._applied(event, short, self.core.reward(reward, partition, ts_ns, time.time()))

    async def on_air(self, event: Any) -> None:
        if DERIVED in tuple(map(tuple, event.message.headers or ())):
            self._position(event)  # ours, applied when its span was joined: not decoded again
            return
        air, short, partition, ts_ns = await self._decode(event, "AirEvent")
        if air is None or air.get("source") == "derived":
            return  # derived events were applied when their span was joined
        await self._applied(event, short, self.core.air(air, partition, ts_ns, time.time()))

    async def _after_event(self, applied: Applied) -> None:
        key, state = applied.key, applied.state
        stored = state.to_bytes(with_calls=False)
        if self.core.outgrown(key, stored):
            await self._close_now(key, state, OVERSIZE)
            return
        # Stored even when this event closes the rollout: its offset may be committed before
        # the tombstone is written (once Kafka has the transitions), and a restart in between
        # must re-close the rollout with this event in it, or it would re-emit other content.
        if applied.new_call is not None:  # before the state naming it: one partition keeps order
            await self._write(call_key(key, applied.new_call), applied.call_bytes, state.partition)
        await self._write(key, stored, state.partition)
        reason = self.core.after_change(key, state, time.time())
        if reason:
            await self._close(key, state, reason)

    # -- closing ----------------------------------------------------------------------------

    async def refresh_ends(self, assigned: frozenset[int]) -> None:
        """Ask the broker for the end offsets of this worker's input partitions (and the
        committed offsets of those it has read nothing of). On failure the old ones stay, and
        so does their time: no rollout counts as caught up by them."""
        if not assigned:
            return
        asked = time.time()
        streams = [(s, p) for s in INPUTS for p in assigned]
        unread = self.positions.unknown_committed(streams)
        try:
            ends = await self.offsets.ends([self._tp(s) for s in streams])
            committed = await self.offsets.committed([self._tp(s) for s in unread]) if unread else {}
        except (KafkaError, TimeoutError, OSError) as exc:
            log.warning("offsets of %d partitions unknown (%r); asking again next tick", len(streams), exc)
            return
        lags = self.positions.update(self._by_stream(ends), self._by_stream(committed), asked)
        for (short, partition), lag in lags.items():
            self.metrics.lag.labels(topic=short, partition=str(partition)).set(lag)

    def _tp(self, stream: tuple[str, int]) -> TP:
        return TP(self.topics.name(stream[0]), stream[1])

    def _by_stream(self, offsets: dict[TP, int]) -> dict[tuple[str, int], int]:
        return {(self.topic_short[tp.topic], tp.partition): o for tp, o in offsets.items()}

    async def _close(self, key: bytes, state: Rollout, reason: str) -> None:
        """Send what closing produces; `record_closes` writes the tombstone once Kafka has it."""
        kept = list(state.calls)
        plan = plan_close(state, reason, self.cfg, self.topics.spans, self.topics.air,
                          self.core.max_reward)
        # Closed at once, before any await: events arriving meanwhile count as late.
        self.core.closing(key, state, reason, time.time(), plan.emitted)
        futures = []
        for dead in plan.dead_letters:
            futures.append(await self.dlq.send(key, dead.body, source_topic=dead.source_topic,
                                               partition=state.partition, offset=-1, force=True,
                                               reason=dead.reason, detail=dead.detail))
        for record in plan.transitions:
            futures.append(await self._send(self.topics.transitions, key,
                                            self.codec.encode("Transition", record), None))
            self.metrics.transitions_out.inc()
        self.metrics.rollouts_closed.labels(reason=reason).inc()
        if state.val_calls:
            self.metrics.val_rollouts.inc()
        self.unrecorded.append((futures, key, state.to_bytes(with_calls=False),
                                state.partition, kept))

    async def _emit_late(self, key: bytes, state: Rollout, transitions: list) -> None:
        """Send the transition of a call read after its rollout closed; its tombstone, which
        now knows the call, is recorded like a close's once Kafka has the transition (a crash
        in between re-emits it identically)."""
        futures = []
        for record in transitions:
            futures.append(await self._send(self.topics.transitions, key,
                                            self.codec.encode("Transition", record), None))
            self.metrics.transitions_out.inc()
        self.unrecorded.append((futures, key, state.to_bytes(with_calls=False),
                                state.partition, []))

    async def _close_now(self, key: bytes, state: Rollout, reason: str) -> None:
        """Close a rollout whose state cannot be stored, and record the close before the
        event that caused it counts as processed: its offset is then never committed ahead
        of the tombstone, and a crash before re-reads the event and closes the same way."""
        await self._close(key, state, reason)
        futures, _, tombstone, _, kept = self.unrecorded.pop()
        if futures:
            await asyncio.gather(*futures)
        await self._record(key, tombstone, state.partition, kept)

    async def record_closes(self) -> None:
        """Write the tombstones (and delete the calls) of closes whose sends Kafka has
        acknowledged, in close order. A failed send raises here, so the worker stops without
        recording a close whose transitions it lost; a restart re-emits them."""
        done = 0
        for futures, key, tombstone, partition, kept in self.unrecorded:
            if not all(f.done() for f in futures):
                break
            for future in futures:
                future.result()
            await self._record(key, tombstone, partition, kept)
            done += 1
        del self.unrecorded[:done]

    async def _record(self, key: bytes, tombstone: bytes, partition: int,
                      kept: list[str]) -> None:
        # The tombstone first, in one record: a crash between the writes then leaves a
        # closed rollout with stale calls (swept by `_rebuild`), never an open one that
        # lost some calls and would re-close with other turn indices and credits.
        await self._write(key, tombstone, partition)
        for span_id in kept:
            await self._write(call_key(key, span_id), None, partition)

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """On a clean stop: record what Kafka acknowledges in time, close our client."""
        futures = [f for pending in self.unrecorded for f in pending[0]]
        if futures:
            await asyncio.wait(futures, timeout=timeout_s)
        await self.record_closes()
        await self.offsets.close()

    async def _write(self, key: bytes, raw: bytes | None, partition: int) -> None:
        """Set (None: delete) a table entry: changelog, then local data."""
        await self._send(self.table.changelog_topic.get_topic_name(), key, raw, partition)
        if raw is None:
            self.table.data.pop(key, None)
        else:
            self.table.data[key] = raw

    async def publish_air(self, record: dict, partition: int) -> None:
        """Publish a derived AirEvent on the air topic, in its span's partition."""
        await self._send(self.topics.air, record["rollout_id"].encode(),
                         self.codec.encode("AirEvent", record), partition, [DERIVED])

    async def _send(self, topic: str, key: bytes, value: bytes | None, partition: int | None,
                    headers: list | None = None) -> asyncio.Future:
        """Hand one record to Faust's producer (see the module's docstring); returns its
        delivery future."""
        future = await self.table.app.producer.send(topic, key, value, partition, None, headers)
        future.add_done_callback(self._delivered)
        return future

    def _delivered(self, future: asyncio.Future) -> None:
        # Cancelled only when the producer stops, after Faust's last flush and commit.
        if not future.cancelled() and future.exception() is not None:
            self.on_send_failure(future.exception())

    # -- timer ------------------------------------------------------------------------------

    def on_revoked(self) -> None:
        """Forget the rollouts and read positions: the next owner of a partition (maybe this
        worker again) reads it from the committed offset."""
        self.core.forget()
        self.metrics.lag.clear()
        self.assigned = None

    async def _rebuild(self, assigned: frozenset[int]) -> None:
        found = []
        for key, raw in list(self.table.data.items()):
            if raw and not key.startswith(b"\x00") and key not in self.core.rollouts:
                state = self._restore(key, raw)
                if state.partition in assigned:
                    found.append((key, state))
        self.core.restored(assigned, found, time.time())
        # Calls of closed rollouts left by a crash between tombstone and deletes (record_closes)
        for key in [k for k in self.table.data if k.startswith(b"\x00")]:
            owner = self.core.rollouts.get(key[1:].split(b"\x00", 1)[0])
            if owner is not None and owner.closed and owner.partition in assigned:
                await self._write(key, None, owner.partition)
        self.assigned = assigned

    async def tick(self, assigned: frozenset[int]) -> None:
        """Record finished closes, close what may close, forget tombstones past retention."""
        if assigned != self.assigned:
            await self._rebuild(assigned)
        await self.record_closes()
        await self.refresh_ends(assigned)
        now = time.time()
        # Rollouts that may close by now are checked every tick; all open ones (time-outs)
        # once a second, which is plenty for timeouts of seconds to minutes.
        full = now - self._last_full_scan >= 1.0
        if full:
            self._last_full_scan = now
        slice_end = time.monotonic() + SLICE_S
        for key, state, reason in self.core.due(assigned, now, full):
            await self._close(key, state, reason)
            if time.monotonic() >= slice_end:
                await asyncio.sleep(0)
                slice_end = time.monotonic() + SLICE_S
        for key, state in self.core.expired(now):
            await self._write(key, None, state.partition)
        self.metrics.rollouts_open.set(len(self.core.open_keys))

    async def resume_stalled(self, consumer: Any) -> None:
        """Resume the fetch of assigned input partitions with records left and none processed
        for STALL_S, seeking those that delivered nothing since their assignment to the
        committed offset (faust-streaming issue 629; see streams/positions.py)."""
        assignment = consumer.assignment()
        assigned = frozenset(tp.partition for tp in assignment if tp.topic == self.topics.spans)
        stalled = set(self.positions.stalled(assigned, time.time()))
        if not stalled:
            return
        tps = [tp for tp in assignment if (self.topic_short.get(tp.topic), tp.partition) in stalled]
        sought = {}
        for tp in tps:
            short = self.topic_short[tp.topic]
            self.metrics.fetch_resumed.labels(topic=short, partition=str(tp.partition)).inc()
            offset = self.positions.restart_offset(short, tp.partition)
            if offset is not None:
                # Resets Faust's read position and aiokafka's fetch state of the partition.
                await consumer.seek(tp, offset)
                sought[f"{short}-{tp.partition}"] = offset
        log.warning("no record processed for %.0f s from %s though records are left; "
                    "resuming their fetch%s", STALL_S, sorted(stalled),
                    f", from the committed offsets {sought}" if sought else "")
        consumer.resume_partitions(tps)
