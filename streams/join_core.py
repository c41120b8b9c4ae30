"""The rollout join's decisions, without Faust or Kafka: which rollout an event belongs to,
what it changes, whether it is dead-lettered, when a rollout closes and which rollouts a
timer tick looks at. The Faust adapter (`streams/join.py`) decodes records, calls these
methods, and writes what they decide (table entries, transitions, dead letters); tests call
them directly.

The worker's rollouts are cached decoded (`rollouts`); `load` is how a rollout missing from the
cache is restored (the adapter reads the table; a test starts it empty).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from streams.air_rules import AirRules, PoisonSpan
from streams.cleaning import BAD_TEMPERATURE, NO_TOKEN_IDS, VAL, Selector
from streams.close_rules import CloseSchedule, close_reason
from streams.positions import ReadPositions
from streams.recorded_call import Unrecoverable
from streams.rollout import ADDED, DUPLICATE, EXTRA_FINAL, LATE, Rollout
from tracetrain.records import TEMPERATURE_ATTRIBUTE, AirEvent, Reward, Span, Transition
from tracetrain.rewards import OUT_OF_BOUNDS, reward_problem
from tracetrain.settings.rewards import RewardSettings
from tracetrain.settings.streams import StreamsSettings

# The details of the dead letters an event that changed nothing gets (reason = outcome).
LATE_DETAIL = "the rollout was already closed"
EXTRA_FINAL_DETAIL = "the rollout already has a final reward"
# The outcome of an event dead-lettered before it reached its rollout (a poison span).
REJECTED = "rejected"
# The outcome of a policy call read after its rollout closed, emitted on its own (`late`).
LATE_CALL = "late_call"
CALL_TOO_LARGE = "call_too_large"
# What a record needs in a producer request beyond its key and value (record and batch
# framing, about 80 bytes; headers are counted apart): rounded up, so that a value at the
# limit is never the one Kafka refuses.
RECORD_OVERHEAD = 512


def call_key(key: bytes, span_id: str) -> bytes:
    """Table key of one kept call. The leading NUL cannot start a rollout key: rollout ids
    containing NUL are dead-lettered (`record_problem`)."""
    return b"\x00" + key + b"\x00" + span_id.encode()


def record_problem(key: bytes | None, record: dict,
                   max_reward: float = RewardSettings().max_abs) -> tuple[str, str] | None:
    """(reason, detail) when a decoded record cannot join its rollout; None when it can."""
    if key != record["rollout_id"].encode():
        # A record without a key is placed by its producer's partitioner: it would open a
        # second state of its rollout on another partition.
        found = "has no key" if key is None else f"key {key!r} differs from rollout_id"
        return ("key_mismatch", f"record {found} {record['rollout_id']!r}; producers must key "
                "by rollout_id (co-partitioning)")
    if "\x00" in record["rollout_id"]:  # table keys of calls start with NUL (call_key)
        return ("invalid_rollout_id",
                f"rollout_id {record['rollout_id']!r} contains NUL; expected text without it")
    if "value" in record:  # a Reward or an AirEvent
        problem = reward_problem(record["value"], max_reward)
        if problem:
            return OUT_OF_BOUNDS, f"value {problem}"
    return None


@dataclass
class Applied:
    """What one event did to its rollout. `dead` holds (reason, detail) pairs for the event's
    own record; `new_call` is the span id of a call kept for training (`call_bytes` its table
    entry); `derived` the AirEvents its span produced (applied already, published by the
    adapter)."""

    key: bytes
    state: Rollout | None  # None: the event was rejected before it reached its rollout
    outcome: str
    dead: list[tuple[str, str]] = field(default_factory=list)
    new_call: str | None = None
    call_bytes: bytes = b""  # the new call as the table stores it
    derived: list[AirEvent] = field(default_factory=list)
    val: bool = False  # the span is a call of `val` traffic (counted, never trained on)
    late: list[Transition] = field(default_factory=list)  # LATE_CALL: its transition

    @property
    def changed(self) -> bool:
        return self.outcome == ADDED


class RolloutJoin:
    def __init__(self, cfg: StreamsSettings, load: Callable[[bytes, int], Rollout | None]
                 = lambda key, partition: None, max_reward: float = RewardSettings().max_abs,
                 retokenize: Callable[[Span], tuple[list[int], list[int]]] | None = None):
        """`retokenize`: token ids for a call recorded without them (streams/retokenize.py);
        None: such calls are dead-lettered as "no token ids"."""
        self.cfg, self.load, self.max_reward = cfg, load, max_reward
        self.retokenize = retokenize
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
        key = span["rollout_id"].encode()
        try:  # before the rollout changes: a span the rules cannot read does not join
            derived = self.rules.derive(span, ts_ns)
        except PoisonSpan as exc:
            return Applied(key, None, REJECTED, dead=[(exc.reason, str(exc))])
        verdict = self.selector.classify(span)
        state = self.rollout(key, partition)
        if verdict in ("keep", NO_TOKEN_IDS) and state.takes_late_call(span["span_id"]):
            late = self._late_call(key, state, span, verdict, derived)
            if late is not None:
                return late
        token_ids, unrecoverable = None, None
        # a late or duplicate span changes nothing: not worth tokenising
        if verdict == NO_TOKEN_IDS and not state.knows(span["span_id"]):
            token_ids, unrecoverable = self._retokenized(span)
        keep = verdict == "keep" or token_ids is not None
        outcome = state.add_span(span, keep, ts_ns, wall, self.cfg.end_marker_attribute,
                                 val=verdict == VAL, token_ids=token_ids)
        applied = self._settle(Applied(key, state, outcome, val=verdict == VAL))
        if not applied.changed:
            return applied
        if unrecoverable is not None:
            applied.dead.append(unrecoverable)
        elif verdict == BAD_TEMPERATURE:
            applied.dead.append((BAD_TEMPERATURE, f"span {span['span_id']} of the trained "
                                 f"policy has {TEMPERATURE_ATTRIBUTE} "
                                 f"{span['attributes'].get(TEMPERATURE_ATTRIBUTE)!r}; "
                                 "expected a number >= 0"))
        applied.derived = derived
        for air in derived:  # applied at once; the air topic's copy is skipped
            state.add_air(air, ts_ns, wall)
        if keep:
            self._keep_call(applied, span["span_id"])
        return applied

    def _late_call(self, key: bytes, state: Rollout, span: Span, verdict: str,
                   derived: list[AirEvent]) -> Applied | None:
        """A policy call read after its rollout closed (its producer was slower than the close
        rules' grace, e.g. retrying through a broker's failover): its transition, credited
        with the close's final reward and the AIR its own span derives. None where it cannot
        be trained (no token ids, out of bounds, too large): then it is a late event."""
        token_ids = None
        if verdict == NO_TOKEN_IDS:
            token_ids, _ = self._retokenized(span)
            if token_ids is None:
                return None
        inter = sum(a["value"] for a in derived if a["span_id"] == span["span_id"])
        transition = state.late_transition(span, token_ids, inter, self.cfg.credit,
                                           self.cfg.gamma, self.cfg.idle_timeout_s)
        if any(reward_problem(transition[name], self.max_reward) for name in
               ("credited_return", "final_reward", "intermediate_reward")) or \
                not self.fits(key, json.dumps(transition).encode()):
            return None
        state.took_late_call(span["span_id"])
        return Applied(key, state, LATE_CALL, late=[transition])

    def _retokenized(self, span: Span) -> tuple[tuple[list[int], list[int]] | None,
                                                 tuple[str, str] | None]:
        """(prompt, response) ids for a call recorded without them, or the dead letter saying
        why there are none."""
        where = f"span {span['span_id']} of the trained policy carries no token ids"
        if self.retokenize is None:
            return None, (NO_TOKEN_IDS, f"{where} and streams.retokenize is off")
        try:
            return self.retokenize(span), None
        except Unrecoverable as exc:
            return None, (exc.reason, f"{where} and cannot be re-tokenised: {exc}")

    def _keep_call(self, applied: Applied, span_id: str) -> None:
        """Store the kept call if its table entry fits a record; else the call is not trained
        and its span goes to the DLQ (the rollout keeps the span's other effects)."""
        raw = applied.state.call_bytes(span_id)
        if self.fits(call_key(applied.key, span_id), raw):
            applied.new_call, applied.call_bytes = span_id, raw
            return
        applied.state.drop_call(span_id)
        applied.dead.append((CALL_TOO_LARGE, f"span {span_id}: its call is {len(raw)} bytes as "
                             f"stored, over streams.max_record_bytes "
                             f"{self.cfg.max_record_bytes}; the call is not trained"))

    def fits(self, key: bytes, value: bytes) -> bool:
        """Whether a table entry stays within the largest record the worker may write."""
        return len(key) + len(value) + RECORD_OVERHEAD <= self.cfg.max_record_bytes

    def outgrown(self, key: bytes, stored: bytes) -> bool:
        """A rollout's state (`stored`, as the table would hold it) outgrew a record: it
        closes now as OVERSIZE, by `on_oversize`, instead of being written."""
        if self.fits(key, stored):
            return False
        self.schedule.unwait(key)
        return True

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

    def closing(self, key: bytes, state: Rollout, reason: str, now: float,
                emitted: bool = True) -> None:
        """`state` closes now (before anything is sent: events arriving meanwhile are late;
        policy calls among them are emitted on their own if the close was `emitted`)."""
        state.close(reason, now, emitted)
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
