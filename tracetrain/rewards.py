"""The one check of a reward's value, used at every door a reward passes: `emit_reward` and the
tracer (which the gateway's `/v1/rewards` goes through), the streams join (rewards, AirEvents,
credited returns) and the learner's batcher (a transition's rewards).

    problem = reward_problem(value, settings.rewards.max_abs)   # None, or what is wrong
"""

from __future__ import annotations

from tracetrain.numbers import finite_real_problem

OUT_OF_BOUNDS = "reward_out_of_bounds"  # the DLQ reason of a refused reward


def reward_problem(value: object, max_abs: float) -> str | None:
    """Why `value` cannot be a reward (the value and what was expected), or None."""
    problem = finite_real_problem(value)
    if problem is not None:
        return problem
    if abs(value) > max_abs:
        return f"{value!r}: expected a number within ±{max_abs:g} (rewards.max_abs)"
    return None
