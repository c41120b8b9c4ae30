"""The one finite-real-number check, through both of its users: a reward and an engine's
sampling parameters (a 400 naming the field, never a 500)."""

from __future__ import annotations

import pytest

from serving.engine.requests import sampling
from tracetrain.errors import BadRequest
from tracetrain.rewards import reward_problem

NOT_FINITE_REALS = [True, None, "1", float("nan"), float("inf"), -float("inf"), [1]]


@pytest.mark.parametrize("value", NOT_FINITE_REALS)
def test_what_is_not_a_finite_real_is_no_reward(value):
    assert "expected a" in reward_problem(value, 1e6)


def test_an_int_past_a_floats_range_is_a_reward_out_of_bounds_not_an_overflow():
    assert "within" in reward_problem(10**400, 1e6)
    assert reward_problem(3, 1e6) is None and reward_problem(-2.5, 1e6) is None


@pytest.mark.parametrize("value", [*NOT_FINITE_REALS[:1], *NOT_FINITE_REALS[2:],
                                   pytest.param(10**400, id="10**400"), -1])
def test_a_temperature_that_is_not_a_finite_real_in_range_is_a_bad_request(value):
    with pytest.raises(BadRequest, match=r"temperature=.*expected a finite number >= 0"):
        sampling({"temperature": value}, [1, 2], context=64, default_max=8)


def test_a_valid_temperature_and_top_p_pass_as_floats():
    req = sampling({"temperature": 0, "top_p": 1}, [1, 2], context=64, default_max=8)
    assert (req.temperature, req.top_p) == (0.0, 1.0) and isinstance(req.temperature, float)
