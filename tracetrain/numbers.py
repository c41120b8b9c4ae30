"""What counts as a finite real number in a JSON body or a record: an int or a float, not a
bool (JSON's true is not 1 here), not NaN or infinite. Used by the reward check and the
engine's sampling parameters."""

from __future__ import annotations

import math

# A sampling temperature below this is greedy (vLLM's bound): the engine reports, and the
# learner scores, the raw model's distribution, never one divided by ~0.
GREEDY_BELOW = 1e-5


def finite_real_problem(value: object) -> str | None:
    """Why `value` is not a finite real number (the value and what was expected), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value!r}: expected a number"
    # Only a float can be NaN or infinite; an int stays exact (math.isfinite would convert it,
    # and one past a float's range raises OverflowError there).
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r}: expected a finite number"
    return None
