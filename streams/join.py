"""The rollout join as run by the Faust agents of `streams/app.py`: decode each record (bad
ones to the DLQ), update the rollout's state in the table, close rollouts and emit their
transitions. Reads spans, rewards, air; writes transitions, dlq and the table's changelog.

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
Faust flushes that producer before it commits offsets; a record Kafka refuses stops the worker
at once (`stop_now`), so no offset past it is committed.

Closing never waits inside an agent: a close sends its transitions at once, and is recorded
in the changelog (a small tombstone) by the timer only once Kafka has acknowledged all of
them, so a crash in between re-emits identical transitions instead of losing them. The timer
does little per tick: it checks the rollouts that wait on a final reward or end marker, the
other open ones (time-outs) once a second, expires tombstones oldest first, and hands the
event loop back to the agents every few milliseconds while it closes.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition
from faust.types import TP

from schemas import Codec, CodecError
from streams.air_rules import AirRules
from streams.cleaning import NO_TOKEN_IDS, Selector
from streams.dlq import DeadLetters
from streams.metrics import StreamsMetrics
from streams.rollout import ADDED, DUPLICATE, EXTRA_FINAL, LATE, Rollout
from tracetrain.settings import Settings

WATCHED = ("spans", "air")  # the streams a final reward waits for (see Rollout.close_reason)
INPUTS = ("spans", "rewards", "air")
SLICE_S = 0.01  # while closing, the timer lets the agents run at least this often
# An assigned input partition with records left and none processed this long is resumed, and
# sought to its committed offset if it delivered nothing since its assignment: after a
# rebalance Faust can leave a partition out of its fetches for good (faust-streaming issue 629;
# seen here as a survivor's lag gauge stuck above 0 in test_two_workers_kill_one, for the
# partitions it took over; resuming alone did not end it there).
STALL_S = 15.0
# Header of the AirEvents this worker derives (they are most of what the air topic holds),
# as aiokafka hands headers over: one (name, bytes) pair of a sequence.
DERIVED = ("tracetrain-source", b"derived")
log = logging.getLogger(__name__)


def stop_now(exc: BaseException) -> None:
    """A send failed for good: exit before Faust commits an offset past the lost record
    (a clean stop would commit). The restart reads those events again."""
    log.critical("Kafka did not take a record the join wrote (%r); stopping at once so that "
                 "no offset past it is committed: a restarted worker reads those events again", exc)
    os._exit(70)


def call_key(key: bytes, span_id: str) -> bytes:
    """Table key of one kept call. The leading NUL cannot start a rollout key: `_decode`
    sends rollout ids containing NUL to the DLQ."""
    return b"\x00" + key + b"\x00" + span_id.encode()


class Offsets:
    """End offsets of input partitions and the group's committed offsets, asked on clients
    of our own. Asked through Faust's consumer, the ListOffsets request queued behind that
    connection's fetch long-poll (Faust's 1.5 s then; streams/transport.py now shortens it): a
    timer tick took ~1.4 s for it alone. Committed offsets come from the broker too, not from
    Faust consumer's private `_committed_offset`, which it fills only at its own seek after
    recovery and maps offset 0 to None: a partition missing there looked unread forever, and
    its rollouts never closed."""

    def __init__(self, bootstrap_servers: str, group_id: str, timeout_s: float = 5.0):
        self.bootstrap_servers, self.group_id, self.timeout_s = bootstrap_servers, group_id, timeout_s
        self.consumer: AIOKafkaConsumer | None = None
        self.admin: AIOKafkaAdminClient | None = None

    async def ends(self, tps: list[TP]) -> dict[TP, int]:
        if self.consumer is None:
            client = AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, group_id=None,
                                      enable_auto_commit=False,
                                      request_timeout_ms=int(self.timeout_s * 1000))
            await client.start()
            self.consumer = client
        ends = await asyncio.wait_for(
            self.consumer.end_offsets([TopicPartition(tp.topic, tp.partition) for tp in tps]),
            self.timeout_s)
        return {TP(tp.topic, tp.partition): end for tp, end in ends.items()}

    async def committed(self, tps: list[TP]) -> dict[TP, int]:
        """The group's next offset to read per partition; -1 where it committed none."""
        if self.admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                        request_timeout_ms=int(self.timeout_s * 1000))
            await admin.start()
            self.admin = admin
        offsets = await asyncio.wait_for(self.admin.list_consumer_group_offsets(
            self.group_id, partitions=[TopicPartition(tp.topic, tp.partition) for tp in tps]),
            self.timeout_s)
        found = {TP(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}
        return {tp: found.get(tp, -1) for tp in tps}

    async def close(self) -> None:
        consumer, admin, self.consumer, self.admin = self.consumer, self.admin, None, None
        if consumer is not None:
            await consumer.stop()
        if admin is not None:
            await admin.close()


class Join:
    def __init__(self, settings: Settings, table: Any, dlq: DeadLetters, metrics: StreamsMetrics,
                 on_send_failure: Callable[[BaseException], None] = stop_now):
        self.settings, self.cfg = settings, settings.streams
        self.table, self.dlq, self.metrics = table, dlq, metrics
        self.on_send_failure = on_send_failure
        self.codec = Codec(registry_url=settings.schema_registry.url)
        self.rules, self.selector = AirRules(self.cfg.air_rules), Selector.from_settings(self.cfg)
        self.cache: dict[bytes, Rollout] = {}
        self.open_keys: set[bytes] = set()  # cached rollouts not closed yet
        self.waiting: set[bytes] = set()  # open rollouts with a final reward or end marker
        # per partition, (settle_ns, key) of waiting rollouts: one closes by read position once
        # every watched stream is read past its settle time, so a tick pops only those
        # instead of asking each waiting rollout (most of a loaded worker's time, py-spy)
        self.settle: dict[int, list[tuple[int, bytes]]] = {}
        self.ending: set[bytes] = set()  # waiting on an end marker alone (wall-clock grace)
        self.expiry: deque[tuple[float, bytes]] = deque()  # closed rollouts, oldest close first
        # closes sent but not yet in the changelog: (send futures, key, state, kept span ids)
        self.unrecorded: list[tuple[list, bytes, Rollout, list[str]]] = []
        self.watermark: dict[tuple[str, int], int] = {}   # highest record ts read, per stream
        self.last_offset: dict[tuple[str, int], int] = {}  # offset of the last record processed
        self.progressed: dict[tuple[str, int], float] = {}  # wall time of that record (or assignment)
        self.quiet_since = time.time()
        self.assigned: frozenset[int] | None = None
        self.offsets = Offsets(settings.kafka.bootstrap_servers,
                               self.cfg.group_id(settings.topics.prefix))
        self._lag_memo: dict[tuple[str, int], bool] | None = None
        self.ends: dict[tuple[str, int], int] = {}  # end offsets, asked at `ends_at`
        # the group's committed offsets, asked for partitions not read since their assignment
        self.committed: dict[tuple[str, int], int] = {}
        self.ends_at = 0.0
        self._last_full_scan = 0.0
        self.topic_short = {settings.topics.spans: "spans", settings.topics.rewards: "rewards",
                            settings.topics.air: "air"}

    # -- per record -------------------------------------------------------------------------

    def _position(self, event: Any) -> tuple[str, int]:
        """Count a record read and advance its partition's read position; (topic, ts_ns)."""
        msg = event.message
        short = self.topic_short.get(msg.topic, msg.topic)
        ts_ns = int(msg.timestamp * 1e9)
        self.metrics.events_in.labels(topic=short).inc()
        self.watermark[(short, msg.partition)] = max(self.watermark.get((short, msg.partition), 0), ts_ns)
        self.last_offset[(short, msg.partition)] = msg.offset
        self.progressed[(short, msg.partition)] = time.time()
        return short, ts_ns

    async def _decode(self, event: Any, name: str) -> tuple[dict | None, str, int, int]:
        msg = event.message
        short, ts_ns = self._position(event)
        try:
            record = self.codec.decode(event.value, name)
        except CodecError as exc:
            await self._dead(event, exc.reason, str(exc))
            return None, short, msg.partition, ts_ns
        key = event.key
        if key is not None and key != record["rollout_id"].encode():
            await self._dead(event, "key_mismatch",
                             f"record key {key!r} differs from rollout_id {record['rollout_id']!r}; "
                             "producers must key by rollout_id (co-partitioning)")
            return None, short, msg.partition, ts_ns
        if "\x00" in record["rollout_id"]:  # see call_key
            await self._dead(event, "invalid_rollout_id",
                             f"rollout_id {record['rollout_id']!r} contains NUL; expected text without it")
            return None, short, msg.partition, ts_ns
        return record, short, msg.partition, ts_ns

    async def _dead(self, event: Any, reason: str, error: str) -> None:
        msg = event.message
        await self.dlq.send(event.key, event.value, source_topic=msg.topic, partition=msg.partition,
                            offset=msg.offset, reason=reason, error=error)

    def _state(self, key: bytes, partition: int) -> Rollout:
        state = self.cache.get(key)
        if state is None:
            raw = self.table.data.get(key)
            state = self._restore(key, raw) if raw else Rollout(key.decode(), partition)
            self._cache(key, state)
        return state

    def _restore(self, key: bytes, raw: bytes) -> Rollout:
        starts = json.loads(raw)["starts"]
        calls = {span_id: self.table.data.get(call_key(key, span_id)) for span_id in starts}
        return Rollout.from_bytes(raw, {s: c for s, c in calls.items() if c is not None})

    def _cache(self, key: bytes, state: Rollout) -> None:
        self.cache[key] = state
        if state.closed:
            self.expiry.append((state.closed_wall or time.time(), key))
        else:
            self.open_keys.add(key)

    async def _outcome(self, event: Any, short: str, outcome: str) -> bool:
        """Count a record that changed nothing; True if it did change its rollout."""
        if outcome == DUPLICATE:
            self.metrics.duplicates.labels(topic=short).inc()
        elif outcome == LATE:
            self.metrics.late.labels(topic=short).inc()
            if self.cfg.late_policy == "dlq":
                await self._dead(event, "late_event", "the rollout was already closed")
        elif outcome == EXTRA_FINAL:
            await self._dead(event, "extra_final_reward", "the rollout already has a final reward")
        return outcome == ADDED

    async def on_span(self, event: Any) -> list[dict]:
        """Join one span; returns the AirEvents derived from it (for the air topic)."""
        span, short, partition, ts_ns = await self._decode(event, "Span")
        if span is None:
            return []
        verdict = self.selector.classify(span)
        key = span["rollout_id"].encode()
        state = self._state(key, partition)
        outcome = state.add_span(span, verdict == "keep", ts_ns, time.time(), self.cfg.end_marker_attribute)
        if not await self._outcome(event, short, outcome):
            return []
        if verdict == NO_TOKEN_IDS:  # re-tokenizing from messages is deferred (see cleaning.py)
            await self._dead(event, NO_TOKEN_IDS, f"span {span['span_id']} of the trained policy "
                             "carries no prompt/response token ids")
        derived = self.rules.derive(span, ts_ns)
        for air in derived:  # the join applies AIR at once; see on_air
            state.add_air(air, ts_ns, time.time())
        await self._after_event(key, state, span["span_id"] if verdict == "keep" else None)
        return derived

    async def on_reward(self, event: Any) -> None:
        reward, short, partition, ts_ns = await self._decode(event, "Reward")
        if reward is None:
            return
        key = reward["rollout_id"].encode()
        state = self._state(key, partition)
        if await self._outcome(event, short, state.add_reward(reward, ts_ns, time.time())):
            await self._after_event(key, state)

    async def on_air(self, event: Any) -> None:
        if DERIVED in tuple(map(tuple, event.message.headers or ())):
            self._position(event)  # ours, applied when its span was joined: not decoded again
            return
        air, short, partition, ts_ns = await self._decode(event, "AirEvent")
        if air is None or air.get("source") == "derived":
            return  # derived events were applied when their span was joined
        key = air["rollout_id"].encode()
        state = self._state(key, partition)
        if await self._outcome(event, short, state.add_air(air, ts_ns, time.time())):
            await self._after_event(key, state)

    async def _after_event(self, key: bytes, state: Rollout, new_call: str | None = None) -> None:
        # Stored even when this event closes the rollout: its offset may be committed before
        # the tombstone is written (once Kafka has the transitions), and a restart in between
        # must re-close the rollout with this event in it, or it would re-emit other content.
        if new_call is not None:  # before the state that names it: one partition keeps order
            await self._write(call_key(key, new_call), state.call_bytes(new_call), state.partition)
        await self._write(key, state.to_bytes(with_calls=False), state.partition)
        reason = self._close_reason(state, time.time())
        if reason:
            self._unwait(key)
            await self._close(key, state, reason)
        else:
            self._wait(key, state)

    def _wait(self, key: bytes, state: Rollout) -> None:
        """Index an open rollout that has a final reward or end marker for the tick."""
        if state.final_ts_ns is not None and state.starts:
            # pushed again at each event: a later span moves the settle time; stale entries
            # are popped and found not closable yet, then the newer one follows
            heapq.heappush(self.settle.setdefault(state.partition, []),
                           (state.settle_ns(self.cfg.close_grace_s), key))
        elif state.end_ts_ns is not None:
            self.ending.add(key)
        else:
            return
        self.waiting.add(key)

    def _unwait(self, key: bytes) -> None:
        self.waiting.discard(key)
        self.ending.discard(key)

    def _candidates(self, assigned: frozenset[int]) -> list[bytes]:
        """Waiting rollouts that may close now: read past their settle time, on a partition
        read to its end (the quiet-and-drained rule), or waiting on an end marker."""
        found = list(self.ending)
        drained = set()
        for p in assigned:
            heap = self.settle.get(p)
            if heap:
                read = min(self.watermark.get((s, p), 0) for s in WATCHED)
                while heap and heap[0][0] < read:
                    found.append(heapq.heappop(heap)[1])
            if not any(self._lagging(s, p) for s in WATCHED):
                drained.add(p)
        if drained:
            found += [k for k in self.waiting if (st := self.cache.get(k)) is not None and st.partition in drained]
        return list(dict.fromkeys(found))

    # -- closing ----------------------------------------------------------------------------

    def _close_reason(self, state: Rollout, now: float) -> str | None:
        p = state.partition

        def read_past(ts_ns: int) -> bool:
            # Strictly after: many records share one millisecond timestamp.
            return all(self.watermark.get((s, p), 0) > ts_ns for s in WATCHED)

        def drained(since_wall: float) -> bool:
            # End offsets asked no earlier than `since_wall`, and all of them processed.
            return self.ends_at >= since_wall and not any(self._lagging(s, p) for s in WATCHED)

        # Idle in event time, not only on the wall clock: while this partition still has
        # records to read, its rollouts are not idle, they are behind.
        behind = any(self._lagging(s, p) for s in INPUTS)
        idle_timeout = float("inf") if behind else self.cfg.idle_timeout_s
        return state.close_reason(now, read_past, drained, self.cfg.close_grace_s, idle_timeout,
                                  self.quiet_since)

    def _lagging(self, short: str, partition: int) -> bool:
        """Are there records of `short`[partition] this worker has not processed yet?
        Memoised for one timer tick (`_lag_memo`), which asks it for every open rollout."""
        if self._lag_memo is not None:
            memo_key = (short, partition)
            if memo_key not in self._lag_memo:
                self._lag_memo[memo_key] = self._lagging_now(short, partition)
            return self._lag_memo[memo_key]
        return self._lagging_now(short, partition)

    def _lagging_now(self, short: str, partition: int) -> bool:
        unread = self._unread(short, partition)
        return unread is None or unread > 0

    def _unread(self, short: str, partition: int) -> int | None:
        """Records of `short`[partition] not processed by this worker; None: not known yet."""
        end = self.ends.get((short, partition))
        if end is None:
            return None  # not asked yet
        done = self.last_offset.get((short, partition))
        if done is not None:
            return max(0, end - done - 1)
        if end == 0:
            return 0
        # Nothing processed here since this worker got the partition: caught up if the
        # group's committed offset (the next one to read) is at the end, as after a restart
        # or a takeover whose previous owner had read everything.
        committed = self.committed.get((short, partition))
        return None if committed is None else end - max(committed, 0)

    async def refresh_ends(self, assigned: frozenset[int]) -> None:
        """Ask the broker for the end offsets of this worker's input partitions (and the
        committed offsets of those it has read nothing of). On failure the old ones stay, and
        so does `ends_at`: no rollout counts as caught up by them."""
        if not assigned:
            return
        asked = time.time()
        names = self.settings.topics.name
        tps = [TP(names(s), p) for s in INPUTS for p in assigned]
        unread = [tp for tp in tps if (self.topic_short[tp.topic], tp.partition) not in self.last_offset
                  and (self.topic_short[tp.topic], tp.partition) not in self.committed]
        try:
            ends = await self.offsets.ends(tps)
            committed = await self.offsets.committed(unread) if unread else {}
        except (KafkaError, TimeoutError, OSError) as exc:
            log.warning("offsets of %d partitions unknown (%r); asking again next tick", len(tps), exc)
            return
        self.ends = {(self.topic_short[tp.topic], tp.partition): end for tp, end in ends.items()}
        self.committed.update({(self.topic_short[tp.topic], tp.partition): offset
                               for tp, offset in committed.items()})
        self.ends_at = asked
        for short, partition in self.ends:
            lag = self._unread(short, partition)
            self.metrics.lag.labels(topic=short, partition=str(partition)).set(-1 if lag is None else lag)

    async def _close(self, key: bytes, state: Rollout, reason: str) -> None:
        """Send what closing produces; `record_closes` writes the tombstone once Kafka has it."""
        kept = list(state.calls)
        futures = await self._emit(key, state, reason)
        self.open_keys.discard(key)
        self.expiry.append((state.closed_wall or time.time(), key))
        self.unrecorded.append((futures, key, state, kept))

    async def _emit(self, key: bytes, state: Rollout, reason: str) -> list:
        """Send what closing `state` produces; mark it closed. Returns the delivery futures."""
        cfg, topics = self.cfg, self.settings.topics
        sends: list[tuple[Any, bytes, bytes, dict]] = []  # (topic, key, value, dlq fields)
        if reason != "timeout" or cfg.on_timeout == "emit":
            _, unknown = state.intermediate(state.ordered_calls())
            for span_id in unknown:
                body = json.dumps({"rollout_id": state.rollout_id, "span_id": span_id}).encode()
                sends.append((None, key, body, {
                    "source_topic": topics.air, "reason": "unknown_span",
                    "error": f"intermediate reward for span {span_id} that is not in the rollout"}))
            for record in state.transitions(reason, cfg.credit, cfg.gamma, cfg.idle_timeout_s):
                sends.append((topics.transitions, key, self.codec.encode("Transition", record), {}))
        else:
            what = "unknown_rollout" if not state.starts else "rollout_timeout"
            summary = {"rollout_id": state.rollout_id, "spans": sorted(state.starts),
                       "rewards": list(state.rewards.values())}
            sends.append((None, key, json.dumps(summary).encode(), {
                "source_topic": topics.spans, "reason": what,
                "error": f"no final reward or end marker within {cfg.idle_timeout_s}s"}))
        # Closed at once, before any await: events arriving meanwhile count as late.
        state.close(reason, time.time())
        futures = []
        for topic, k, value, dead in sends:
            if topic is None:
                futures.append(await self.dlq.send(k, value, partition=state.partition, offset=-1,
                                                   force=True, **dead))
            else:
                futures.append(await self._send(topic, k, value, None))
                self.metrics.transitions_out.inc()
        self.metrics.rollouts_closed.labels(reason=reason).inc()
        return futures

    async def record_closes(self) -> None:
        """Write the tombstones (and delete the calls) of closes whose sends Kafka has
        acknowledged, in close order. A failed send raises here, so the worker stops without
        recording a close whose transitions it lost; a restart re-emits them."""
        done = 0
        for futures, key, state, kept in self.unrecorded:
            if not all(f.done() for f in futures):
                break
            for future in futures:
                future.result()
            # The tombstone first, in one record: a crash between the writes then leaves a
            # closed rollout with stale calls (swept by `_rebuild`), never an open one that
            # lost some calls and would re-close with other turn indices and credits.
            await self._write(key, state.to_bytes(with_calls=False), state.partition)
            for span_id in kept:
                await self._write(call_key(key, span_id), None, state.partition)
            done += 1
        del self.unrecorded[:done]

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
        await self._send(self.settings.topics.air, record["rollout_id"].encode(),
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
        """Forget the read positions with the rollouts: the next owner of a partition (maybe
        this worker again) reads it from the committed offset, which `_lagging` then asks."""
        for state in (self.cache, self.open_keys, self.waiting, self.settle, self.ending,
                      self.expiry, self.watermark, self.last_offset, self.committed,
                      self.progressed):
            state.clear()
        self.metrics.lag.clear()
        self.assigned = None

    async def _rebuild(self, assigned: frozenset[int]) -> None:
        restored = []
        for key, raw in list(self.table.data.items()):
            if raw and not key.startswith(b"\x00") and key not in self.cache:
                state = self._restore(key, raw)
                if state.partition in assigned:
                    restored.append((key, state))
        restored.sort(key=lambda item: item[1].closed_wall or 0.0)  # expiry: oldest first
        for key, state in restored:
            self._cache(key, state)
            if not state.closed:
                self._wait(key, state)
        # Calls of closed rollouts left by a crash between tombstone and deletes (record_closes)
        for key in [k for k in self.table.data if k.startswith(b"\x00")]:
            owner = self.cache.get(key[1:].split(b"\x00", 1)[0])
            if owner is not None and owner.closed and owner.partition in assigned:
                await self._write(key, None, owner.partition)
        self.assigned, self.quiet_since = assigned, time.time()

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
        self._lag_memo = {}
        slice_end = time.monotonic() + SLICE_S
        try:
            for key in list(self.open_keys) if full else self._candidates(assigned):
                state = self.cache.get(key)
                if state is None or state.closed or state.partition not in assigned:
                    self._unwait(key)
                    continue
                reason = self._close_reason(state, now)
                if reason:
                    self._unwait(key)
                    await self._close(key, state, reason)
                if time.monotonic() >= slice_end:
                    await asyncio.sleep(0)
                    slice_end = time.monotonic() + SLICE_S
        finally:
            self._lag_memo = None
        await self._expire(now)
        self.metrics.rollouts_open.set(len(self.open_keys))

    def stalled(self, assigned: frozenset[int], now: float) -> list[tuple[str, int]]:
        """Assigned input partitions with records left to read and none processed for STALL_S
        (each reported at most once per STALL_S)."""
        found = []
        for short in INPUTS:
            for p in assigned:
                since = self.progressed.setdefault((short, p), now)
                if now - since >= STALL_S and self._unread(short, p):
                    found.append((short, p))
                    self.progressed[(short, p)] = now
        return found

    def restart_offset(self, short: str, partition: int) -> int | None:
        """Where a stalled partition is read again from: the group's committed offset, for a
        partition that has delivered nothing since this worker got it (the stall seen after
        takeovers). None where records were processed (Faust's buffers may still hold the
        next ones: a seek would deliver them twice) or the committed offset is not known."""
        if (short, partition) in self.last_offset:
            return None
        committed = self.committed.get((short, partition))
        return None if committed is None else max(committed, 0)

    async def _expire(self, now: float) -> None:
        retention = self.cfg.closed_retention_s
        while self.expiry and now - self.expiry[0][0] > retention:
            _, key = self.expiry.popleft()
            state = self.cache.get(key)
            if state is not None and state.closed:
                await self._write(key, None, state.partition)
                del self.cache[key]
