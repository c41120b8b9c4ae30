"""Replay's command line: positions parse; the learner is a stack service."""

from __future__ import annotations

import pytest

from learner.errors import LearnerError
from learner.replay import parse_position
from tracetrain.settings import load_settings


def test_positions_are_offsets_or_iso_timestamps():
    assert parse_position("42") == ("offset", 42)
    kind, ms = parse_position("2026-12-02T16:00:00+00:00")
    assert kind == "time" and ms == 1796227200000
    with pytest.raises(LearnerError, match="expected an offset"):
        parse_position("yesterday")


def test_learner_is_a_stack_service():
    """Declared once, listed by the stack without any CLI module imported first (it used to
    be registered as a side effect of importing the CLI)."""
    from infra.stack import SERVICES
    from learner.service import LEARNER

    assert SERVICES["learner"] is LEARNER
    assert LEARNER.argv(load_settings())[-1] == "learner"
