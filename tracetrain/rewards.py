"""The one check of a reward's value, used at every door a reward passes: `emit_reward` and the
tracer (which the gateway's `/v1/rewards` goes through), the streams join (rewards, AirEvents,
credited returns) and the learner's batcher (a transition's rewards).

    problem = reward_problem(value, settings.rewards.max_abs)   # None, or what is wrong
"""

from __future__ import annotations

import math

OUT_OF_BOUNDS = "reward_out_of_bounds"  # the DLQ reason of a refused reward


def reward_problem(value: object, max_abs: float) -> str | None:
    """Why `value` cannot be a reward (the value and what was expected), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value!r}: expected a number"
    # Only a float can be NaN or infinite; an int is compared exact (math.isfinite would
    # convert it, and a huge one overflows there).
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r}: expected a finite number"
    if abs(value) > max_abs:
        return f"{value!r}: expected a number within ±{max_abs:g} (rewards.max_abs)"
    return None
