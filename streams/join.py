"""The rollout join as run by the Faust agents of `streams/app.py`: decode each record (bad
ones to the DLQ), update the rollout's state in the table, close rollouts and emit their
transitions. Reads spans, rewards, air; writes transitions, dlq and the table's changelog.

The table holds `Rollout.to_bytes()` per rollout_id; a decoded copy of this worker's rollouts
is cached (and rebuilt from the table after a rebalance). Writes from an agent go through the
table as usual; the timer (time-outs, closes waiting for the partition to catch up) has no
current event, so it writes the changelog of the rollout's own partition explicitly.
"""

from __future__ import annotations

import json
import time
from typing import Any

from faust.types import TP

from schemas import Codec, CodecError
from streams.air_rules import AirRules
from streams.cleaning import NO_TOKEN_IDS, Selector
from streams.dlq import DeadLetters
from streams.metrics import StreamsMetrics
from streams.rollout import ADDED, DUPLICATE, EXTRA_FINAL, LATE, Rollout
from tracetrain.settings import Settings

WATCHED = ("spans", "air")  # the streams a final reward waits for (see Rollout.close_reason)


class Join:
    def __init__(self, settings: Settings, table: Any, transitions: Any, dlq: DeadLetters,
                 metrics: StreamsMetrics, consumer: Any = None):
        self.settings, self.cfg = settings, settings.streams
        self.table, self.transitions, self.dlq, self.metrics = table, transitions, dlq, metrics
        self.codec = Codec(registry_url=settings.schema_registry.url)
        self.rules, self.selector = AirRules(self.cfg.air_rules), Selector.from_settings(self.cfg)
        self.cache: dict[bytes, Rollout] = {}
        self.watermark: dict[tuple[str, int], int] = {}   # highest record ts read, per stream
        self.last_read: dict[tuple[str, int], float] = {}  # wall time of the last record read
        self.last_offset: dict[tuple[str, int], int] = {}  # offset of the last record processed
        self.quiet_since = time.time()
        self.assigned: frozenset[int] | None = None
        self.consumer = consumer
        self._lag_memo: dict[tuple[str, int], bool] | None = None
        self.ends: dict[tuple[str, int], int] = {}  # end offsets, asked at `ends_at`
        self.ends_at = 0.0
        self.waiting: set[bytes] = set()  # open rollouts with a final reward or end marker
        self._last_full_scan = 0.0
        self.topic_short = {settings.topics.spans: "spans", settings.topics.rewards: "rewards",
                            settings.topics.air: "air"}

    # -- per record -------------------------------------------------------------------------

    async def _decode(self, event: Any, name: str) -> tuple[dict | None, str, int, int]:
        msg = event.message
        short = self.topic_short.get(msg.topic, msg.topic)
        ts_ns = int(msg.timestamp * 1e9)
        self.metrics.events_in.labels(topic=short).inc()
        self.watermark[(short, msg.partition)] = max(self.watermark.get((short, msg.partition), 0), ts_ns)
        self.last_read[(short, msg.partition)] = time.time()
        self.last_offset[(short, msg.partition)] = msg.offset
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
        return record, short, msg.partition, ts_ns

    async def _dead(self, event: Any, reason: str, error: str) -> None:
        msg = event.message
        await self.dlq.send(event.key, event.value, source_topic=msg.topic, partition=msg.partition,
                            offset=msg.offset, reason=reason, error=error)

    def _state(self, key: bytes, partition: int) -> Rollout:
        state = self.cache.get(key)
        if state is None:
            raw = self.table.get(key)
            state = Rollout.from_bytes(raw) if raw else Rollout(key.decode(), partition)
            self.cache[key] = state
        return state

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
        await self._after_event(key, state)
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
        air, short, partition, ts_ns = await self._decode(event, "AirEvent")
        if air is None or air.get("source") == "derived":
            return  # derived events were applied when their span was joined
        key = air["rollout_id"].encode()
        state = self._state(key, partition)
        if await self._outcome(event, short, state.add_air(air, ts_ns, time.time())):
            await self._after_event(key, state)

    async def _after_event(self, key: bytes, state: Rollout) -> None:
        reason = self._close_reason(state, time.time())
        if reason:
            self.waiting.discard(key)
            await self._close(key, state, reason, in_event=True)
        else:
            if state.final_ts_ns is not None or state.end_ts_ns is not None:
                self.waiting.add(key)
            self.table[key] = state.to_bytes()

    # -- closing ----------------------------------------------------------------------------

    def _close_reason(self, state: Rollout, now: float) -> str | None:
        p, grace = state.partition, self.cfg.close_grace_s

        def read_past(ts_ns: int) -> bool:
            return all(self.watermark.get((s, p), 0) >= ts_ns for s in WATCHED)

        def caught_up(ts_ns: int) -> bool:
            # Read past ts in this partition; or, by end offsets asked from the broker after
            # this rollout's last event, nothing is left to read there.
            fresh = self.ends_at > state.last_wall
            return all(self.watermark.get((s, p), 0) >= ts_ns
                       or (fresh and not self._lagging(s, p)) for s in WATCHED)

        # Idle in event time, not only on the wall clock: while this partition still has
        # records to read, its rollouts are not idle, they are behind.
        behind = any(self._lagging(s, p) for s in ("spans", "rewards", "air"))
        idle_timeout = float("inf") if behind else self.cfg.idle_timeout_s
        return state.close_reason(now, caught_up, grace, idle_timeout, self.quiet_since, read_past)

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
        if self.consumer is None:
            return False
        end = self.ends.get((short, partition))
        if end is None:
            return True  # not asked yet
        done = self.last_offset.get((short, partition))
        if done is None:  # nothing read since start: compare with what the group committed
            tp = TP(self.settings.topics.name(short), partition)
            committed = self.consumer._committed_offset.get(tp)
            return not (end == 0 or (committed is not None and committed >= end - 1))
        return done + 1 < end

    async def refresh_ends(self, assigned: frozenset[int]) -> None:
        """Ask the broker for the end offsets of this worker's input partitions."""
        if self.consumer is None or not assigned:
            return
        asked = time.time()
        tps = [TP(self.settings.topics.name(s), p) for s in ("spans", "rewards", "air") for p in assigned]
        ends = await self.consumer.highwaters(*tps)
        self.ends = {(self.topic_short[tp.topic], tp.partition): end for tp, end in ends.items()}
        self.ends_at = asked

    async def _close(self, key: bytes, state: Rollout, reason: str, in_event: bool) -> None:
        """Emit, wait until Kafka has it, and only then record the close in the changelog: a
        crash in between re-emits identical transitions on replay instead of losing them."""
        for future in await self._emit(key, state, reason):
            await future
        self._write(key, state, in_event)

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
                sends.append((self.transitions, key, self.codec.encode("Transition", record), {}))
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
                futures.append(await topic.send(key=k, value=value, force=True))
                self.metrics.transitions_out.inc()
        self.metrics.rollouts_closed.labels(reason=reason).inc()
        return futures

    def _write(self, key: bytes, state: Rollout | None, in_event: bool) -> None:
        raw = state.to_bytes() if state is not None else None
        if in_event:
            self.table[key] = raw
            return
        partition = state.partition if state is not None else self.cache[key].partition
        self.table.send_changelog(partition, key, raw)
        if raw is None:
            self.table.data.pop(key, None)
        else:
            self.table.data[key] = raw

    # -- timer ------------------------------------------------------------------------------

    def on_revoked(self) -> None:
        self.cache.clear()
        self.assigned = None

    def _rebuild(self, assigned: frozenset[int]) -> None:
        for key, raw in list(self.table.data.items()):
            if raw and key not in self.cache:
                state = Rollout.from_bytes(raw)
                if state.partition in assigned:
                    self.cache[key] = state
        self.assigned, self.quiet_since = assigned, time.time()

    async def tick(self, assigned: frozenset[int]) -> None:
        """Close what may close, forget closed rollouts after their retention."""
        if assigned != self.assigned:
            self._rebuild(assigned)
        await self.refresh_ends(assigned)
        now = time.time()
        # Rollouts waiting to close are checked every tick; the rest (time-outs, retention)
        # once a second, which is plenty for timeouts of seconds to minutes.
        full = now - self._last_full_scan >= 1.0
        if full:
            self._last_full_scan = now
            self.waiting = {k for k, st in self.cache.items()
                            if not st.closed and (st.final_ts_ns is not None or st.end_ts_ns is not None)}
        keys = list(self.cache) if full else list(self.waiting)
        open_count, closing, futures = 0, [], []
        self._lag_memo = {}
        for key in keys:
            state = self.cache.get(key)
            if state is None or state.partition not in assigned:
                self.waiting.discard(key)
                continue
            if state.closed:
                if now - (state.closed_wall or now) > self.cfg.closed_retention_s:
                    self._write(key, None, in_event=False)
                    self.cache.pop(key, None)
                continue
            reason = self._close_reason(state, now)
            if reason:
                futures += await self._emit(key, state, reason)
                closing.append((key, state))
                self.waiting.discard(key)
            else:
                open_count += 1
        self._lag_memo = None
        if full:
            self.metrics.rollouts_open.set(open_count)
        for future in futures:  # all closes of this tick wait for Kafka together
            await future
        for key, state in closing:
            self._write(key, state, in_event=False)
