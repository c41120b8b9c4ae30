"""Rewards from Python: `emit_reward(publisher, rollout_id, value, final=True, ...)`.

Writes one Reward (schemas/avsc/Reward.v1) to the rewards topic, keyed by rollout_id; the
gateway's `POST /v1/rewards` and the tracer's `Rollout.reward` go through the same function,
so one check (`tracetrain.rewards`, bound `settings.rewards.max_abs`) guards them all.
"""

from __future__ import annotations

from producers.errors import ProducerError
from producers.gateway.ids import ID_PATTERN
from producers.publisher import Publisher
from producers.records import new_reward
from tracetrain.rewards import reward_problem


def emit_reward(publisher: Publisher, rollout_id: str, value: float, *, final: bool = True,
                name: str | None = None, span_id: str | None = None, task_id: str | None = None,
                agent_name: str | None = None) -> dict:
    """Validate and publish one reward; returns the record. `final=True` closes the rollout."""
    if not isinstance(rollout_id, str) or not ID_PATTERN.match(rollout_id):
        raise ProducerError(f"rollout_id {rollout_id!r}: expected 1-128 characters of "
                            "[A-Za-z0-9._:@-]")
    problem = reward_problem(value, publisher.settings.rewards.max_abs)
    if problem:
        raise ProducerError(f"value {problem}")
    if not isinstance(final, bool):
        raise ProducerError(f"final {final!r}: expected true or false")
    reward = new_reward(rollout_id, float(value), final=final, name=name, span_id=span_id,
                        task_id=task_id, agent_name=agent_name)
    publisher.publish_reward(reward)
    return reward
