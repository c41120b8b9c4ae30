"""The learner's error types: bad settings for a mode, unusable checkpoints, replay ranges; a
training step that went non-finite; a learner fenced off its experiment by a newer one."""

from __future__ import annotations

from tracetrain.errors import TracetrainError


class LearnerError(TracetrainError):
    """The learner cannot go on; the message names the bad value and what was expected."""


class NonFiniteStep(LearnerError):
    """A step's loss or gradient was NaN or infinite: the step was not taken. `reason` is the
    DLQ reason its transitions get (non_finite_loss, non_finite_grad)."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(detail)


class LearnerFenced(LearnerError):
    """Another learner started on the same experiment: this one must not register again."""
