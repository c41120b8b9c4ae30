"""The prompt optimiser's error type."""

from __future__ import annotations

from tracetrain.errors import TracetrainError


class OptimizerError(TracetrainError):
    """No rollouts to learn from, an optimiser LLM that cannot be reached, a registry refusal;
    the message names the value and what was expected."""
