"""Advantages from credited returns: `group` (GRPO), `batch`, `baseline` (running mean per agent).

    from learner.advantages import make_advantage
    adv = make_advantage(settings.learner)   # then adv.compute(transitions) -> list[float]

Reads each transition's `credited_return` and `final_reward` (the streams stage's credit
assignment). `group` normalises rollout returns within one task's rollouts (LightningRL's
GRPO over rollouts) and adds each call's shaping; `rollout_weights` gives the loss one weight
per rollout (`learner.loss_normalisation`); `GroupBuffer` holds a
task's transitions until `group_size` rollouts arrived or `group_wait_s` passed, then releases
what it has. Every strategy has `state_dict`/`load_state_dict` so checkpoints resume exactly.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

from tracetrain.settings.learner import LearnerSettings

_EPS = 1e-4


def _normalise(values: list[float]) -> list[float]:
    if not values:
        return []
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    # A group whose returns are all equal carries no signal: advantage 0, not a division by 0.
    return [(v - mean) / (std + _EPS) for v in values]


class BatchAdvantage:
    """(return - mean) / std over the micro-batch."""

    name = "batch"

    def compute(self, transitions: list[dict]) -> list[float]:
        return _normalise([t["credited_return"] for t in transitions])

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _rollout_return(t: dict) -> float:
    # Every call of a rollout carries the rollout's final reward; older records without it
    # fall back to the call's credited return.
    return t.get("final_reward", t["credited_return"])


def _shaping(t: dict) -> float:
    """The call's own part of its credited return (AIR's intermediate reward, a discounted
    return's difference); 0 under `identical` credit."""
    return t["credited_return"] - _rollout_return(t)


class GroupAdvantage:
    """LightningRL/GRPO over rollouts: a rollout's return (its final reward) is normalised
    within its task's group of rollouts, every call of the rollout carries that advantage plus
    its own shaping (`_shaping`). Rollouts with no task, or alone in their task in this batch
    (production traffic whose tasks never repeat), are normalised together, as `batch` does."""

    name = "group"

    def compute(self, transitions: list[dict]) -> list[float]:
        rollouts: dict[str, float] = {}
        tasks: dict[str, set[str]] = {}
        for t in transitions:
            rollouts.setdefault(t["rollout_id"], _rollout_return(t))
            tasks.setdefault(t.get("task_id") or f"\0{t['rollout_id']}", set()).add(t["rollout_id"])
        advantage: dict[str, float] = {}
        singles = []
        for members in tasks.values():
            if len(members) < 2:
                singles.extend(members)
                continue
            ordered = sorted(members)
            advantage.update(zip(ordered, _normalise([rollouts[r] for r in ordered]), strict=True))
        advantage.update(zip(singles, _normalise([rollouts[r] for r in singles]), strict=True))
        return [advantage[t["rollout_id"]] + _shaping(t) for t in transitions]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def rollout_weights(transitions: list[dict]) -> list[float]:
    """Per-call loss weights that give every rollout of the batch the same total weight, so a
    rollout of five calls does not count five times one of a single call. They sum to the
    number of calls (the loss keeps its scale): B / (rollouts * calls of this rollout)."""
    calls: dict[str, int] = {}
    for t in transitions:
        calls[t["rollout_id"]] = calls.get(t["rollout_id"], 0) + 1
    scale = len(transitions) / len(calls) if calls else 0.0
    return [scale / calls[t["rollout_id"]] for t in transitions]


class BaselineAdvantage:
    """return - running mean of the agent's returns (before this batch updates it): for traffic
    whose tasks never repeat. The mean is an exponential moving average with `decay`."""

    name = "baseline"

    def __init__(self, decay: float = 0.9):
        self.decay = decay
        self.means: dict[str, float] = {}

    def compute(self, transitions: list[dict]) -> list[float]:
        out = []
        for t in transitions:
            agent = t.get("agent_name") or ""
            out.append(t["credited_return"] - self.means.get(agent, 0.0))
        for t in transitions:
            agent = t.get("agent_name") or ""
            prev = self.means.get(agent)
            r = t["credited_return"]
            self.means[agent] = r if prev is None else self.decay * prev + (1 - self.decay) * r
        return out

    def state_dict(self) -> dict:
        return {"means": dict(self.means)}

    def load_state_dict(self, state: dict) -> None:
        self.means = dict(state.get("means", {}))


def make_advantage(learner: LearnerSettings):
    if learner.advantage == "group":
        return GroupAdvantage()
    if learner.advantage == "batch":
        return BatchAdvantage()
    return BaselineAdvantage(learner.baseline_decay)


class GroupBuffer:
    """Holds each task's transitions until `group_size` distinct rollouts arrived or the oldest
    waited `wait_s`; `release` returns the complete groups in arrival order. The held
    transitions are part of the checkpoint (they were consumed but not trained yet)."""

    def __init__(self, group_size: int, wait_s: float, clock: Callable[[], float] = time.monotonic):
        self.group_size = group_size
        self.wait_s = wait_s
        self.clock = clock
        self.groups: OrderedDict[str, dict] = OrderedDict()

    def add(self, transitions: list[dict]) -> None:
        for t in transitions:
            key = t.get("task_id") or f"\0{t['rollout_id']}"
            group = self.groups.setdefault(key, {"since": self.clock(), "items": []})
            group["items"].append(t)

    def release(self, flush: bool = False) -> list[dict]:
        now = self.clock()
        out = []
        for key in list(self.groups):
            group = self.groups[key]
            rollouts = {t["rollout_id"] for t in group["items"]}
            if flush or len(rollouts) >= self.group_size or now - group["since"] >= self.wait_s:
                out.extend(group["items"])
                del self.groups[key]
        return out

    def __len__(self) -> int:
        return sum(len(g["items"]) for g in self.groups.values())

    def state_dict(self) -> dict:
        return {"groups": [[k, g["items"]] for k, g in self.groups.items()]}

    def load_state_dict(self, state: dict) -> None:
        # Wait clocks restart on resume: a restarted learner gives late rollouts a full bound again.
        self.groups = OrderedDict(
            (k, {"since": self.clock(), "items": items}) for k, items in state.get("groups", [])
        )
