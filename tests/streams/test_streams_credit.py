"""Credit assignment modes, with hypothesis properties on sums and call order."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.credit import assign
from streams.errors import StreamsError

rewards = st.floats(-10, 10, allow_nan=False)
inter_lists = st.lists(st.floats(-5, 5, allow_nan=False), min_size=0, max_size=12)
gammas = st.floats(0.0, 1.0, allow_nan=False)


def test_identical_gives_every_call_the_final_reward():
    out = assign("identical", 1.0, [0.5, -0.5, 0.0])
    assert [c.credited_return for c in out] == [1.0, 1.0, 1.0]
    assert [c.intermediate_reward for c in out] == [0.5, -0.5, 0.0]
    assert all(c.final_reward == 1.0 for c in out)


def test_air_adds_each_calls_own_reward():
    out = assign("air", 1.0, [0.5, -0.5, 0.0])
    assert [c.credited_return for c in out] == [1.5, 0.5, 1.0]


def test_discounted_returns():
    out = assign("discounted", 1.0, [0.0, 0.5, 0.0], gamma=0.5)
    # G2 = 0 + 1.0 ; G1 = 0.5 + 0.5*1 ; G0 = 0 + 0.5*1.0
    assert [c.credited_return for c in out] == [0.5, 1.0, 1.0]


def test_bad_mode_and_gamma_are_named():
    with pytest.raises(StreamsError, match="'greedy'"):
        assign("greedy", 1.0, [0.0])
    with pytest.raises(StreamsError, match="gamma 2"):
        assign("discounted", 1.0, [0.0], gamma=2)


@given(rewards, inter_lists)
def test_identical_sum(final, inter):
    out = assign("identical", final, inter)
    assert len(out) == len(inter)
    assert math.isclose(sum(c.credited_return for c in out), final * len(inter), abs_tol=1e-9)


@given(rewards, inter_lists)
def test_air_sum_and_order(final, inter):
    out = assign("air", final, inter)
    assert [c.intermediate_reward for c in out] == inter  # call order preserved
    assert math.isclose(sum(c.credited_return for c in out), final * len(inter) + sum(inter),
                        abs_tol=1e-9)


@given(rewards, inter_lists, gammas)
def test_discounted_recursion_and_first_return(final, inter, gamma):
    out = assign("discounted", final, inter, gamma)
    if not inter:
        assert out == []
        return
    g = [c.credited_return for c in out]
    n = len(inter)
    for t in range(n - 1):
        assert math.isclose(g[t] - gamma * g[t + 1], inter[t], abs_tol=1e-6)
    assert math.isclose(g[-1], inter[-1] + final, abs_tol=1e-9)
    expected0 = sum(gamma ** t * r for t, r in enumerate(inter)) + gamma ** (n - 1) * final
    assert math.isclose(g[0], expected0, abs_tol=1e-6)


@given(rewards, inter_lists)
def test_discounted_with_gamma_one_is_reward_to_go(final, inter):
    out = assign("discounted", final, inter, 1.0)
    for t, c in enumerate(out):
        assert math.isclose(c.credited_return, sum(inter[t:]) + final, abs_tol=1e-6)
