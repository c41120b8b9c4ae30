"""Advantages: group (GRPO), batch, baseline, and the group buffer's wait bound."""

from __future__ import annotations

import pytest

from learner.advantages import (
    BaselineAdvantage,
    BatchAdvantage,
    GroupAdvantage,
    GroupBuffer,
    rollout_weights,
)
from testkit.learner import make_transition


def test_group_normalises_within_each_task():
    ts = [make_transition(0, task="a", ret=1.0), make_transition(1, task="a", ret=0.0),
          make_transition(2, task="b", ret=10.0), make_transition(3, task="b", ret=10.0)]
    adv = GroupAdvantage().compute(ts)
    assert adv[0] == pytest.approx(1.0, abs=1e-3) and adv[1] == pytest.approx(-1.0, abs=1e-3)
    # Equal returns in a group carry no signal, whatever their size.
    assert adv[2] == adv[3] == 0.0


def test_batch_normalises_over_the_batch():
    ts = [make_transition(i, ret=r) for i, r in enumerate([0.0, 1.0, 2.0, 3.0])]
    adv = BatchAdvantage().compute(ts)
    assert sum(adv) == pytest.approx(0.0, abs=1e-6)
    assert adv == sorted(adv) and adv[-1] > 1.0


def test_baseline_is_a_running_mean_per_agent_and_survives_a_checkpoint():
    base = BaselineAdvantage(decay=0.5)
    first = base.compute([make_transition(0, ret=1.0)])
    assert first == [1.0]  # no baseline yet
    assert base.compute([make_transition(1, ret=1.0)]) == [0.0]
    restored = BaselineAdvantage(decay=0.5)
    restored.load_state_dict(base.state_dict())
    assert restored.compute([make_transition(2, ret=3.0)]) == [2.0]


def test_group_buffer_releases_full_groups_then_waits_at_most_the_bound():
    now = [0.0]
    buf = GroupBuffer(group_size=2, wait_s=10.0, clock=lambda: now[0])
    buf.add([make_transition(0, task="a"), make_transition(1, task="b")])
    assert buf.release() == [] and len(buf) == 2
    buf.add([make_transition(2, task="a")])
    assert [t["rollout_id"] for t in buf.release()] == ["ro-0", "ro-2"]
    now[0] = 11.0
    assert [t["rollout_id"] for t in buf.release()] == ["ro-1"]  # trains with what it has
    buf.add([make_transition(3, task="c")])
    restored = GroupBuffer(2, 10.0, clock=lambda: now[0])
    restored.load_state_dict(buf.state_dict())
    assert len(restored) == 1 and restored.release(flush=True)[0]["rollout_id"] == "ro-3"


def _call(i: int, rollout: str, task: str | None, final: float, shaping: float = 0.0) -> dict:
    t = make_transition(i, task=task, ret=final + shaping)
    t.update(rollout_id=rollout, final_reward=final, intermediate_reward=shaping)
    return t


def test_group_normalises_rollouts_not_calls_and_adds_each_calls_air_shaping():
    # Rollout A: three calls with AIR intermediate rewards; rollout B: one call. Normalised per
    # call (the old way) A's three calls would outvote B; per rollout A is +1, B is -1.
    ts = [_call(0, "A", "t", 1.0, 0.1), _call(1, "A", "t", 1.0, 0.0), _call(2, "A", "t", 1.0, 0.2),
          _call(3, "B", "t", 0.0)]
    adv = GroupAdvantage().compute(ts)
    assert adv == pytest.approx([1.1, 1.0, 1.2, -1.0], abs=1e-3)


def test_group_falls_back_to_batch_normalisation_where_tasks_do_not_repeat():
    ts = [_call(0, "A", "x", 0.0), _call(1, "B", "y", 1.0), _call(2, "C", None, 2.0),
          _call(3, "D", "z", 5.0), _call(4, "E", "z", 5.0)]
    adv = GroupAdvantage().compute(ts)
    # A, B, C have no repeated task: normalised together (mean 1, std sqrt(2/3)); z's two equal
    # rollouts carry no signal.
    assert adv == pytest.approx([-1.2247, 0.0, 1.2247, 0.0, 0.0], abs=1e-3)


def test_rollout_weights_give_every_rollout_the_same_total():
    ts = [_call(0, "A", "t", 1.0), _call(1, "A", "t", 1.0), _call(2, "A", "t", 1.0),
          _call(3, "B", "t", 0.0)]
    weights = rollout_weights(ts)
    assert weights == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2.0])
    assert sum(weights) == pytest.approx(len(ts))
