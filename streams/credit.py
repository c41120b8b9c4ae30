"""Credit assignment (LightningRL): one rollout's final reward and per-call intermediate
rewards become one credited return per policy call, in call order. Pure functions; the join
(`streams/rollout.py`) and the tests' reference computation both use them.

    identical   every call gets the final reward (Agent Lightning's default)
    air         final reward plus the call's own intermediate reward
    discounted  G_t = r_t + gamma * G_{t+1}, with r_t the call's intermediate reward and the
                final reward added at the last call
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.errors import StreamsError
from tracetrain.modes import CREDIT_MODES


@dataclass(frozen=True)
class Credit:
    """What one call's transition carries: the parts separately, so a learner can recombine."""

    final_reward: float
    intermediate_reward: float
    credited_return: float


def assign(mode: str, final_reward: float, intermediate: list[float], gamma: float = 1.0) -> list[Credit]:
    """Credited returns for calls in order; `intermediate[i]` is the i-th call's own reward."""
    if mode not in CREDIT_MODES:
        raise StreamsError(f"credit mode {mode!r}: expected one of {CREDIT_MODES}")
    if not 0.0 <= gamma <= 1.0:
        raise StreamsError(f"gamma {gamma}: expected a value in [0, 1]")
    if mode == "identical":
        returns = [final_reward for _ in intermediate]
    elif mode == "air":
        returns = [final_reward + r for r in intermediate]
    else:
        returns = [0.0] * len(intermediate)
        following = 0.0
        for i in range(len(intermediate) - 1, -1, -1):
            reward = intermediate[i] + (final_reward if i == len(intermediate) - 1 else 0.0)
            following = reward + gamma * following
            returns[i] = following
    return [Credit(final_reward, r, g) for r, g in zip(intermediate, returns, strict=True)]
