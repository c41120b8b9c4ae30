"""Replay's command line: positions parse; the learner is a stack service."""

from __future__ import annotations

import pytest

from learner.errors import LearnerError
from learner.replay import parse_position


def test_positions_are_offsets_or_iso_timestamps():
    assert parse_position("42") == ("offset", 42)
    kind, ms = parse_position("2026-12-02T16:00:00+00:00")
    assert kind == "time" and ms == 1796227200000
    with pytest.raises(LearnerError, match="expected an offset"):
        parse_position("yesterday")


def test_learner_is_a_stack_service():
    from infra.stack import SERVICES

    assert "learner" in SERVICES
