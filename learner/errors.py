"""The learner's error type: bad settings for a mode, unusable checkpoints, replay ranges."""

from __future__ import annotations

from tracetrain.errors import TracetrainError


class LearnerError(TracetrainError):
    """The learner cannot go on; the message names the bad value and what was expected."""
