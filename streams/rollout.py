"""The state of one rollout in the join, as stored (JSON bytes) in the Faust table keyed by
rollout_id (the kept calls' token lists apart, one entry per call: see `to_bytes`). Pure: the agents in `streams/app.py` feed it decoded events with the record's
timestamp and the wall clock, ask whether it may close, and emit what it builds.

Life cycle
- Spans are deduplicated by span_id, AIR events by (span, rule, source), rewards by
  (final, span, name, timestamp). Order does not matter: a reward may come before its spans.
- A rollout closes on its first final reward, once the partition's spans and air streams have
  been read `close_grace_s` (record time) past both that reward and the rollout's last span,
  or, at the head of the log, once the rollout has been quiet for `close_grace_s` and nothing
  is left to read there (see `close_reason`): spans and rewards travel on different topics,
  and a reward may come before its spans. Or on an end-marker span (closing with the rewards
  seen after `close_grace_s` if no final reward came). Or after `idle_timeout_s` without
  events (then emitted or sent to the DLQ by `on_timeout`).
- A closed rollout emits its transitions once and is kept as a small tombstone for
  `closed_retention_s`; it remembers the span ids it closed with (a re-read one is a
  duplicate). Late policy: events after close change nothing; they are counted and sent to
  the DLQ as "late_event" (or only counted, `late_policy=ignore`), except a policy call of a
  rollout whose close was emitted: no close rule can wait for a producer that is still
  retrying (a broker's failover; the publisher never gives a record up), so such a call is
  emitted on its own (`late_transition`), credited with the close's final reward. A second,
  different final reward before close is "extra_final_reward"; the first one wins.
- Everything a transition holds derives from the events (no wall clock): `transition_id` is
  a hash of rollout_id and span_id and `emitted_ns` is the closing record's timestamp, so a
  replay after a crash re-emits byte-identical transitions.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from streams.cleaning import sampling_temperature
from streams.credit import Credit, assign
from tracetrain.records import Transition

ADDED, DUPLICATE, LATE, EXTRA_FINAL = "added", "duplicate", "late_event", "extra_final_reward"


def transition_id(rollout_id: str, span_id: str) -> str:
    return hashlib.sha256(f"{rollout_id}\x00{span_id}".encode()).hexdigest()[:32]


@dataclass
class Rollout:
    rollout_id: str
    partition: int
    calls: dict[str, dict] = field(default_factory=dict)   # kept policy calls, by span_id
    starts: dict[str, int] = field(default_factory=dict)   # start_time_ns of every span seen
    air: dict[str, dict] = field(default_factory=dict)
    rewards: dict[str, dict] = field(default_factory=dict)
    task_id: str | None = None
    final_key: str | None = None
    final_ts_ns: int | None = None
    end_ts_ns: int | None = None
    end_wall: float | None = None
    last_ts_ns: int = 0
    last_span_ts_ns: int = 0
    last_wall: float = 0.0
    closed: str | None = None
    closed_wall: float | None = None
    val_calls: int = 0  # LLM calls of `val` traffic seen (never trained on)
    # Kept by the tombstone of a closed rollout: the span ids it knows (closed with, or
    # emitted late since), so a re-read one is a duplicate; the final reward a call that
    # arrives after the close is credited with (None: such calls are not emitted, the close
    # was dead-lettered); the turn index of the next such call.
    seen: list[str] = field(default_factory=list)
    late_final: float | None = None
    turns: int = 0

    # -- storage ----------------------------------------------------------------------------

    def to_bytes(self, with_calls: bool = True) -> bytes:
        """The state as JSON; without `calls` (the token lists) it stays small, so the join
        can rewrite it on every event and store each call once on its own (`call_bytes`)."""
        # vars(), not dataclasses.asdict: asdict deep-copies every token list (hot path)
        fields = vars(self) if with_calls else {**vars(self), "calls": {}}
        return json.dumps(fields, separators=(",", ":")).encode()

    def call_bytes(self, span_id: str) -> bytes:
        return json.dumps(self.calls[span_id], separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, calls: dict[str, bytes] | None = None) -> Rollout:
        """Inverse of `to_bytes`; `calls` adds the `call_bytes` stored apart, by span_id."""
        state = cls(**json.loads(data))
        for span_id, raw in (calls or {}).items():
            state.calls[span_id] = json.loads(raw)
        return state

    # -- events -----------------------------------------------------------------------------

    def _touch(self, ts_ns: int, wall: float) -> None:
        self.last_ts_ns = max(self.last_ts_ns, ts_ns)
        self.last_wall = max(self.last_wall, wall)

    def knows(self, span_id: str) -> bool:
        """Whether a span of this id would change nothing (closed, or seen already)."""
        return bool(self.closed) or span_id in self.starts

    def takes_late_call(self, span_id: str) -> bool:
        """Closed, and a call it has not seen would still be emitted (`late_transition`)."""
        return bool(self.closed) and self.late_final is not None and span_id not in self.seen

    def add_span(self, span: dict, keep: bool, ts_ns: int, wall: float, end_attribute: str,
                 val: bool = False, token_ids: tuple[list[int], list[int]] | None = None) -> str:
        """Add a span; `keep`: a call to train on (its temperature checked by the caller),
        `val`: a call of validation traffic, counted and never trained on; `token_ids`:
        (prompt, response) ids the join re-tokenised for a call recorded without them."""
        span_id = span["span_id"]
        if self.closed:
            return DUPLICATE if span_id in self.seen else LATE
        if span_id in self.starts:
            return DUPLICATE
        self.starts[span_id] = span["start_time_ns"]
        self.task_id = self.task_id or span.get("task_id")
        if keep:
            self.calls[span_id] = kept_call(span, token_ids)
        self.val_calls += val
        if (span.get("attributes") or {}).get(end_attribute) == "true" and self.end_ts_ns is None:
            self.end_ts_ns, self.end_wall = ts_ns, wall
        self.last_span_ts_ns = max(self.last_span_ts_ns, ts_ns)
        self._touch(ts_ns, wall)
        return ADDED

    def drop_call(self, span_id: str) -> None:
        """Train no transition for this call (its span stays known to the rollout)."""
        del self.calls[span_id]

    def add_air(self, event: dict, ts_ns: int, wall: float) -> str:
        if self.closed:
            return LATE
        key = f"{event['span_id']}|{event['rule']}|{event.get('source', 'derived')}"
        if key in self.air:
            return DUPLICATE
        self.air[key] = {"span_id": event["span_id"], "value": float(event["value"])}
        self._touch(ts_ns, wall)
        return ADDED

    def add_reward(self, reward: dict, ts_ns: int, wall: float) -> str:
        if self.closed:
            return LATE
        final = bool(reward.get("final", True))
        key = f"{final}|{reward.get('span_id')}|{reward.get('name')}|{reward['timestamp_ns']}"
        if key in self.rewards:
            return DUPLICATE
        if final and self.final_key is not None:
            return EXTRA_FINAL
        self.rewards[key] = {"value": float(reward["value"]), "final": final,
                             "span_id": reward.get("span_id")}
        self.task_id = self.task_id or reward.get("task_id")
        if final:
            self.final_key, self.final_ts_ns = key, ts_ns
        self._touch(ts_ns, wall)
        return ADDED

    # -- closing ----------------------------------------------------------------------------

    def settle_ns(self, grace_s: float) -> int:
        """Record time past which the partition must be read before a final reward closes."""
        return max(self.final_ts_ns, self.last_span_ts_ns) + int(grace_s * 1e9)

    def close_reason(self, now_wall: float, read_past: Callable[[int], bool],
                     drained: Callable[[float], bool], grace_s: float, idle_timeout_s: float,
                     quiet_since: float = 0.0) -> str | None:
        """Why this rollout may close now, or None.

        `read_past(ts_ns)`: has each watched stream (spans, air) of this partition been read up
        to a record created strictly after `ts_ns`? (A producer appends to a partition in the
        order it creates records, so everything it created up to ts_ns has been read then.)
        `drained(since_wall)`: by end offsets asked at or after wall time `since_wall`, has this
        worker processed everything in those streams? `quiet_since`: quiet and idle time count
        from no earlier than this (the worker's start, so a restart does not time out everything).

        One rule for a final reward, whatever the order its events came in: the rollout's
        spans are complete once the partition has been read `grace` (record time) past both
        the reward and the rollout's last span, or, at the head of the log, once the rollout
        was quiet for `grace` and nothing was left to read after that. Never "a record at the
        reward's timestamp": timestamps are milliseconds, and a producer writes many records,
        this rollout's next spans among them, within one."""
        if self.closed:
            return None
        quiet_from = max(self.last_wall, quiet_since)
        quiet = now_wall - quiet_from >= grace_s
        if self.final_ts_ns is not None and self.starts:
            if read_past(self.settle_ns(grace_s)) or (quiet and drained(quiet_from + grace_s)):
                return "final"
        if self.end_ts_ns is not None and self.final_ts_ns is None and self.end_wall is not None \
                and now_wall - max(self.end_wall, quiet_since) >= grace_s:
            return "end"
        if now_wall - quiet_from >= idle_timeout_s:
            # A rollout that has its final reward is complete whatever the read-position
            # bookkeeping says: it closes as "final" (same transitions, same emitted_ns), it
            # never goes to the DLQ as a timeout.
            if self.final_ts_ns is not None and self.starts:
                return "final"
            return "timeout"
        return None

    def final_reward(self) -> float:
        """The first final reward plus every rollout-level (no span_id) non-final reward."""
        return sum(r["value"] for r in self.rewards.values() if r["final"] or r["span_id"] is None)

    def ordered_calls(self) -> list[str]:
        return sorted(self.calls, key=lambda s: (self.calls[s]["start"], s))

    def intermediate(self, order: list[str]) -> tuple[list[float], list[str]]:
        """Per-call intermediate rewards (AIR and per-span rewards) and the span ids that
        credit no known span. A credit on a non-policy span goes to the latest policy call
        that started at or before it (the first call if none did)."""
        totals = [0.0] * len(order)
        index = {span_id: i for i, span_id in enumerate(order)}
        starts = [self.calls[s]["start"] for s in order]
        unknown: list[str] = []
        credits = [(a["span_id"], a["value"]) for a in self.air.values()]
        credits += [(r["span_id"], r["value"]) for r in self.rewards.values()
                    if not r["final"] and r["span_id"] is not None]
        for span_id, value in credits:
            if span_id in index:
                totals[index[span_id]] += value
            elif span_id in self.starts and order:
                at = bisect_right(starts, self.starts[span_id]) - 1
                totals[max(at, 0)] += value
            else:
                unknown.append(span_id)
        return totals, unknown

    def emitted_ns(self, reason: str, idle_timeout_s: float) -> int:
        if reason == "final" and self.final_ts_ns is not None:
            return self.final_ts_ns
        if reason == "end" and self.end_ts_ns is not None:
            return self.end_ts_ns
        return self.last_ts_ns + int(idle_timeout_s * 1e9)

    def transitions(self, reason: str, mode: str, gamma: float,
                    idle_timeout_s: float) -> list[Transition]:
        """One Transition record per kept call, in call order."""
        order = self.ordered_calls()
        inter, _ = self.intermediate(order)
        credits = assign(mode, self.final_reward(), inter, gamma)
        emitted = self.emitted_ns(reason, idle_timeout_s)
        return [self._transition(span_id, self.calls[span_id], turn, turn == len(order) - 1,
                                 credit, emitted)
                for turn, (span_id, credit) in enumerate(zip(order, credits, strict=True))]

    def late_transition(self, span: dict, token_ids: tuple[list[int], list[int]] | None,
                        intermediate: float, mode: str, gamma: float,
                        idle_timeout_s: float) -> Transition:
        """The transition of a policy call read after this rollout closed (`takes_late_call`):
        its producer was slower than the close rules' grace, e.g. retrying through a broker's
        failover. Credited as a last call with the close's final reward, turn index after the
        calls already emitted (then `took_late_call`). Derived from the tombstone and the span alone: a replay re-emits it identically."""
        [credit] = assign(mode, self.late_final, [intermediate], gamma)
        return self._transition(span["span_id"], kept_call(span, token_ids), self.turns, True,
                                credit, self.emitted_ns(self.closed, idle_timeout_s))

    def took_late_call(self, span_id: str) -> None:
        """The late call's transition is emitted: a re-read copy is a duplicate from now."""
        self.seen.append(span_id)
        self.turns += 1

    def _transition(self, span_id: str, call: dict, turn: int, last: bool, credit: Credit,
                    emitted: int) -> Transition:
        return {
            "transition_id": transition_id(self.rollout_id, span_id),
            "rollout_id": self.rollout_id, "task_id": call["task_id"] or self.task_id,
            "agent_name": call["agent_name"], "span_id": span_id, "model": call["model"],
            "turn_index": turn, "is_last": last,
            "prompt_token_ids": call["prompt_token_ids"],
            "response_token_ids": call["response_token_ids"],
            "behaviour_logprobs": call["behaviour_logprobs"],
            "policy_version": call["policy_version"],
            # calls stored before the temperature was recorded have none (unknown)
            "sampling_temperature": call.get("sampling_temperature"),
            "retokenized": call.get("retokenized", False),
            "final_reward": credit.final_reward,
            "intermediate_reward": credit.intermediate_reward,
            "credited_return": credit.credited_return,
            "span_start_ns": call["start"], "emitted_ns": emitted,
        }

    def close(self, reason: str, wall: float, emitted: bool = True) -> None:
        """Become a tombstone: only what recognising late events needs, and, when the close
        was `emitted` (not dead-lettered), what a late call's transition needs."""
        self.seen = sorted(self.starts)
        self.late_final = self.final_reward() if emitted else None
        self.turns = len(self.calls)
        self.closed, self.closed_wall = reason, wall
        self.calls, self.starts, self.air, self.rewards = {}, {}, {}, {}


def kept_call(span: dict, token_ids: tuple[list[int], list[int]] | None = None) -> dict:
    """What a rollout keeps of a policy call to train on; `token_ids`: (prompt, response) ids
    the join re-tokenised for a call recorded without them."""
    llm = span["llm"]
    prompt, response = token_ids or (llm["prompt_token_ids"], llm["response_token_ids"])
    return {
        "agent_name": span.get("agent_name") or "", "task_id": span.get("task_id"),
        "model": llm["model"], "policy_version": llm.get("policy_version"),
        "prompt_token_ids": prompt, "response_token_ids": response,
        # the engine's logprobs are of its own tokens: re-tokenised ids have none
        "behaviour_logprobs": [] if token_ids else llm.get("response_logprobs") or [],
        "sampling_temperature": sampling_temperature(span),
        "retokenized": token_ids is not None,
        "start": span["start_time_ns"],
    }
