"""When a rollout closes and what closing it writes: plain Python over a `Rollout` and the
worker's `ReadPositions`, called by the join core (`streams/join_core.py`).

A rollout with a final reward closes once its partition's spans and air are read past the
reward and its last span (plus `close_grace_s`), or, at the head of the log, once nothing is
left to read; one with only an end marker after `close_grace_s` of wall time; an idle one after
`idle_timeout_s` (counted only while its partition has nothing left to read: a worker behind
on its input is not idle); one whose stored state outgrew a Kafka record at once (OVERSIZE,
decided by the join core). A timed-out or outgrown rollout is emitted or dead-lettered by
policy; one whose credited returns fall outside `rewards.max_abs` is dead-lettered.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field

from streams.positions import WATCHED, ReadPositions
from streams.rollout import Rollout
from tracetrain.records import Transition
from tracetrain.rewards import OUT_OF_BOUNDS, reward_problem
from tracetrain.settings.rewards import RewardSettings
from tracetrain.settings.streams import StreamsSettings

OVERSIZE = "oversize"  # close reason: the rollout's state outgrew a Kafka record
# A summary dead letter lists this many span ids and rewards (and counts them all): a
# rollout's whole state can be larger than a record.
SUMMARY_ITEMS = 100


def close_reason(state: Rollout, now: float, positions: ReadPositions, cfg: StreamsSettings,
                 quiet_since: float) -> str | None:
    """Why `state` closes now ("final", "end_marker", "timeout"), or None: it stays open."""
    p = state.partition
    idle_timeout = float("inf") if positions.behind(p) else cfg.idle_timeout_s
    return state.close_reason(now, lambda ts_ns: positions.read_past(p, ts_ns),
                              lambda since: positions.drained(p, since), cfg.close_grace_s,
                              idle_timeout, quiet_since)


class CloseSchedule:
    """The open rollouts that have a final reward or an end marker, indexed so that a timer
    tick looks only at those that may close now: per partition a heap of (settle time, key),
    popped once every watched stream is read past it, instead of asking each waiting rollout
    (that was most of a loaded worker's time, py-spy)."""

    def __init__(self) -> None:
        self.waiting: set[bytes] = set()
        self.settle: dict[int, list[tuple[int, bytes]]] = {}
        self.ending: set[bytes] = set()  # waiting on an end marker alone (wall-clock grace)

    def wait(self, key: bytes, state: Rollout, grace_s: float) -> None:
        if state.final_ts_ns is not None and state.starts:
            # pushed again at each event: a later span moves the settle time; stale entries
            # are popped and found not closable yet, then the newer one follows
            heapq.heappush(self.settle.setdefault(state.partition, []),
                           (state.settle_ns(grace_s), key))
        elif state.end_ts_ns is not None:
            self.ending.add(key)
        else:
            return
        self.waiting.add(key)

    def unwait(self, key: bytes) -> None:
        self.waiting.discard(key)
        self.ending.discard(key)

    def candidates(self, assigned: frozenset[int], positions: ReadPositions,
                   partition_of: dict[bytes, Rollout]) -> list[bytes]:
        """Waiting rollouts that may close now: read past their settle time, on a partition
        read to its end (the quiet-and-drained rule), or waiting on an end marker."""
        found = list(self.ending)
        drained = set()
        for p in assigned:
            heap = self.settle.get(p)
            if heap:
                read = min(positions.watermark.get((s, p), 0) for s in WATCHED)
                while heap and heap[0][0] < read:
                    found.append(heapq.heappop(heap)[1])
            if positions.drained(p):
                drained.add(p)
        if drained:
            found += [k for k in self.waiting
                      if (st := partition_of.get(k)) is not None and st.partition in drained]
        return list(dict.fromkeys(found))

    def clear(self) -> None:
        for index in (self.waiting, self.settle, self.ending):
            index.clear()


@dataclass
class DeadLetterPlan:
    """A record the stage makes for the DLQ (offset -1): its body and the contract's fields."""

    body: bytes
    source_topic: str
    reason: str
    detail: str


@dataclass
class ClosePlan:
    """What closing one rollout writes: its transitions, or dead letters, or both."""

    transitions: list[Transition] = field(default_factory=list)
    dead_letters: list[DeadLetterPlan] = field(default_factory=list)
    # False: the rollout went to the DLQ instead; a policy call read after the close follows
    # it there (as a late event) instead of being emitted (`Rollout.late_transition`)
    emitted: bool = True


def plan_close(state: Rollout, reason: str, cfg: StreamsSettings, spans_topic: str,
               air_topic: str, max_reward: float = RewardSettings().max_abs) -> ClosePlan:
    """The transitions of a closed rollout (a timed-out or outgrown one: only by its policy,
    `on_timeout` / `on_oversize`), a dead letter per intermediate reward naming a span the
    rollout lacks; or, for a rollout that is not emitted or whose credited returns are out of
    bounds, one dead letter summarising it (none for a timed-out rollout of `val` traffic
    alone, which often gets no reward: its spans stay on the spans topic)."""
    plan = ClosePlan()
    if reason == "timeout" and state.val_calls and not state.calls:
        # validation traffic, never trained on: nothing to keep for a retry
        return ClosePlan(emitted=_emitted(reason, cfg))
    if not _emitted(reason, cfg):
        what = "unknown_rollout" if not state.starts else \
            "rollout_too_large" if reason == OVERSIZE else "rollout_timeout"
        detail = (f"its state outgrew streams.max_record_bytes {cfg.max_record_bytes}"
                  if reason == OVERSIZE else
                  f"no final reward or end marker within {cfg.idle_timeout_s}s")
        plan.dead_letters.append(_summary(state, spans_topic, what, detail))
        plan.emitted = False
        return plan
    transitions = state.transitions(reason, cfg.credit, cfg.gamma, cfg.idle_timeout_s)
    for t in transitions:
        for name in ("credited_return", "final_reward", "intermediate_reward"):
            problem = reward_problem(t[name], max_reward)
            if problem:
                plan.dead_letters.append(_summary(
                    state, spans_topic, OUT_OF_BOUNDS, f"turn {t['turn_index']} {name} {problem}"))
                plan.emitted = False
                return plan
    _, unknown = state.intermediate(state.ordered_calls())
    for span_id in unknown:
        body = json.dumps({"rollout_id": state.rollout_id, "span_id": span_id}).encode()
        plan.dead_letters.append(DeadLetterPlan(
            body, air_topic, "unknown_span",
            f"intermediate reward for span {span_id} that is not in the rollout"))
    plan.transitions = transitions
    return plan


def _emitted(reason: str, cfg: StreamsSettings) -> bool:
    if reason == "timeout":
        return cfg.on_timeout == "emit"
    if reason == OVERSIZE:
        return cfg.on_oversize == "emit"
    return True


def _summary(state: Rollout, spans_topic: str, reason: str, detail: str) -> DeadLetterPlan:
    spans, rewards = sorted(state.starts), list(state.rewards.values())
    summary = {"rollout_id": state.rollout_id, "span_count": len(spans),
               "spans": spans[:SUMMARY_ITEMS], "reward_count": len(rewards),
               "rewards": rewards[:SUMMARY_ITEMS]}
    return DeadLetterPlan(json.dumps(summary).encode(), spans_topic, reason, detail)
