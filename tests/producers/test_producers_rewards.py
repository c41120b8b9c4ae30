"""emit_reward's validation: each bad value is refused with its name, before anything is sent;
a value beyond `settings.rewards.max_abs` (or not finite) names the value and the bound."""

from __future__ import annotations

import pytest

from producers.errors import ProducerError
from producers.rewards import emit_reward
from tracetrain.settings import load_settings


class Recorder:
    def __init__(self):
        self.sent = []
        self.settings = load_settings()  # emit_reward reads the bound there

    def publish_reward(self, reward):
        self.sent.append(reward)


@pytest.mark.parametrize("kwargs, field", [
    ({"rollout_id": "bad id", "value": 1.0}, "rollout_id"),
    ({"rollout_id": "", "value": 1.0}, "rollout_id"),
    ({"rollout_id": "ro-1", "value": float("nan")}, "value"),
    ({"rollout_id": "ro-1", "value": "1"}, "value"),
    ({"rollout_id": "ro-1", "value": True}, "value"),
    ({"rollout_id": "ro-1", "value": 1.0, "final": "yes"}, "final"),
    ({"rollout_id": "ro-1", "value": 1e200}, r"1e\+200: expected a number within ±1e\+06 "),
    ({"rollout_id": "ro-1", "value": -2_000_000}, "rewards.max_abs"),
    ({"rollout_id": "ro-1", "value": 10**400}, "rewards.max_abs"),
    ({"rollout_id": "ro-1", "value": float("-inf")}, "-inf: expected a finite number"),
])
def test_bad_rewards_are_refused_by_field(kwargs, field):
    rec = Recorder()
    with pytest.raises(ProducerError, match=field):
        emit_reward(rec, **kwargs)
    assert rec.sent == []


def test_good_reward_is_complete():
    rec = Recorder()
    emit_reward(rec, "ro-1", 0.5, final=False, name="air", span_id="s1", task_id="t")
    [r] = rec.sent
    assert (r["rollout_id"], r["value"], r["final"], r["name"], r["span_id"], r["task_id"]) == \
        ("ro-1", 0.5, False, "air", "s1", "t")
    assert r["timestamp_ns"] > 0
