"""The rollout join's decisions, without Faust or Kafka: which rollout an event belongs to,
what it changes, whether it is dead-lettered, when a rollout closes and which rollouts a
timer tick looks at. The Faust adapter (`streams/join.py`) decodes records, calls these
methods, and writes what they decide (table entries, transitions, dead letters); tests call
them directly.

The worker's rollouts are cached decoded (`rollouts`); `load` is how a rollout missing from the
cache is restored (the adapter reads the table; a test starts it empty).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from streams.air_rules import AirRules
from streams.cleaning import NO_TOKEN_IDS, Selector
from streams.close_rules import CloseSchedule, close_reason
from streams.positions import ReadPositions
from streams.rollout import ADDED, DUPLICATE, EXTRA_FINAL, LATE, Rollout
from tracetrain.records import AirEvent, Reward, Span
from tracetrain.settings.streams import StreamsSettings

# The details of the dead letters an event that changed nothing gets (reason = outcome).
LATE_DETAIL = "the rollout was already closed"
EXTRA_FINAL_DETAIL = "the rollout already has a final reward"


def record_problem(key: bytes | None, record: dict) -> tuple[str, str] | None:
    """(reason, detail) when a decoded record cannot join its rollout; None when it can."""
    if key is not None and key != record["rollout_id"].encode():
        return ("key_mismatch",
                f"record key {key!r} differs from rollout_id {record['rollout_id']!r}; "
                "producers must key by rollout_id (co-partitioning)")
    if "\x00" in record["rollout_id"]:  # table keys of calls start with NUL (join.call_key)
        return ("invalid_rollout_id",
                f"rollout_id {record['rollout_id']!r} contains NUL; expected text without it")
    return None


@dataclass
class Applied:
    """What one event did to its rollout. `dead` holds (reason, detail) pairs for the event's
    own record; `new_call` is the span id of a call kept for training; `derived` the AirEvents
    its span produced (applied already, published by the adapter)."""

    key: bytes
    state: Rollout
    outcome: str
    dead: list[tuple[str, str]] = field(default_factory=list)
    new_call: str | None = None
    derived: list[AirEvent] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.outcome == ADDED


class RolloutJoin:
    def __init__(self, cfg: StreamsSettings, load: Callable[[bytes, int], Rollout | None]
                 = lambda key, partition: None):
        self.cfg, self.load = cfg, load
        self.rules, self.selector = AirRules(cfg.air_rules), Selector.from_settings(cfg)
        self.rollouts: dict[bytes, Rollout] = {}
        self.open_keys: set[bytes] = set()  # cached rollouts not closed yet
        self.expiry: deque[tuple[float, bytes]] = deque()  # closed rollouts, oldest close first
        self.positions = ReadPositions()
        self.schedule = CloseSchedule()
        self.quiet_since = time.time()

    # -- the rollout store --------------------------------------------------------------------

    def rollout(self, key: bytes, partition: int) -> Rollout:
        state = self.rollouts.get(key)
        if state is None:
            state = self.load(key, partition) or Rollout(key.decode(), partition)
            self.remember(key, state)
        return state

    def remember(self, key: bytes, state: Rollout) -> None:
        self.rollouts[key] = state
        if state.closed:
            self.expiry.append((state.closed_wall or time.time(), key))
        else:
            self.open_keys.add(key)

    def expired(self, now: float) -> list[tuple[bytes, Rollout]]:
        """Closed rollouts past `closed_retention_s`, forgotten here; the adapter deletes
        them from the table."""
        gone = []
        while self.expiry and now - self.expiry[0][0] > self.cfg.closed_retention_s:
            _, key = self.expiry.popleft()
            state = self.rollouts.get(key)
            if state is not None and state.closed:
                del self.rollouts[key]
                gone.append((key, state))
        return gone

    def forget(self) -> None:
        """Partitions revoked: forget rollouts and read positions; rebuilt from the table."""
        for index in (self.rollouts, self.open_keys, self.expiry):
            index.clear()
        self.schedule.clear()
        self.positions.clear()

    # -- events -------------------------------------------------------------------------------

    def _settle(self, applied: Applied) -> Applied:
        if applied.outcome == DUPLICATE or applied.outcome == ADDED:
            return applied
        if applied.outcome == LATE:
            if self.cfg.late_policy == "dlq":
                applied.dead.append((LATE, LATE_DETAIL))
        elif applied.outcome == EXTRA_FINAL:
            applied.dead.append((EXTRA_FINAL, EXTRA_FINAL_DETAIL))
        return applied

    def span(self, span: Span, partition: int, ts_ns: int, wall: float) -> Applied:
        verdict = self.selector.classify(span)
        key = span["rollout_id"].encode()
        state = self.rollout(key, partition)
        outcome = state.add_span(span, verdict == "keep", ts_ns, wall,
                                 self.cfg.end_marker_attribute)
        applied = self._settle(Applied(key, state, outcome))
        if not applied.changed:
            return applied
        if verdict == NO_TOKEN_IDS:  # re-tokenizing from messages is deferred (see cleaning.py)
            applied.dead.append((NO_TOKEN_IDS, f"span {span['span_id']} of the trained policy "
                                 "carries no prompt/response token ids"))
        applied.derived = self.rules.derive(span, ts_ns)
        for air in applied.derived:  # applied at once; the air topic's copy is skipped
            state.add_air(air, ts_ns, wall)
        applied.new_call = span["span_id"] if verdict == "keep" else None
        return applied

    def reward(self, reward: Reward, partition: int, ts_ns: int, wall: float) -> Applied:
        key = reward["rollout_id"].encode()
        state = self.rollout(key, partition)
        return self._settle(Applied(key, state, state.add_reward(reward, ts_ns, wall)))

    def air(self, air: AirEvent, partition: int, ts_ns: int, wall: float) -> Applied:
        key = air["rollout_id"].encode()
        state = self.rollout(key, partition)
        return self._settle(Applied(key, state, state.add_air(air, ts_ns, wall)))

    # -- closing ------------------------------------------------------------------------------

    def close_reason(self, state: Rollout, now: float) -> str | None:
        return close_reason(state, now, self.positions, self.cfg, self.quiet_since)

    def after_change(self, key: bytes, state: Rollout, now: float) -> str | None:
        """A rollout changed: the reason it closes now, or None (then it is scheduled)."""
        reason = self.close_reason(state, now)
        if reason:
            self.schedule.unwait(key)
        else:
            self.schedule.wait(key, state, self.cfg.close_grace_s)
        return reason

    def closing(self, key: bytes, state: Rollout, reason: str, now: float) -> None:
        """`state` closes now (before anything is sent: events arriving meanwhile are late)."""
        state.close(reason, now)
        self.open_keys.discard(key)
        self.expiry.append((state.closed_wall or now, key))

    def due(self, assigned: frozenset[int], now: float,
            full: bool) -> Iterator[tuple[bytes, Rollout, str]]:
        """The rollouts of `assigned` that close now, with their reasons: of all open ones
        when `full` (time-outs), else of the scheduled candidates. Yields as it goes, so the
        adapter can hand the event loop back between closes."""
        keys = list(self.open_keys) if full else \
            self.schedule.candidates(assigned, self.positions, self.rollouts)
        self.positions.memoise()
        try:
            for key in keys:
                state = self.rollouts.get(key)
                if state is None or state.closed or state.partition not in assigned:
                    self.schedule.unwait(key)
                    continue
                reason = self.close_reason(state, now)
                if reason:
                    self.schedule.unwait(key)
                    yield key, state, reason
        finally:
            self.positions.forget_memo()

    def restored(self, assigned: frozenset[int], found: list[tuple[bytes, Rollout]],
                 now: float) -> None:
        """The rollouts of newly assigned partitions, read back from the table."""
        found.sort(key=lambda item: item[1].closed_wall or 0.0)  # expiry: oldest first
        for key, state in found:
            self.remember(key, state)
            if not state.closed:
                self.schedule.wait(key, state, self.cfg.close_grace_s)
        self.quiet_since = now
