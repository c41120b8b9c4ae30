"""The examples' error type: a bad problem file or count, a tool call an example refuses."""

from __future__ import annotations

from tracetrain.errors import TracetrainError


class ExamplesError(TracetrainError, ValueError):
    """Bad input to an example; the message names the value and what was expected. Also a
    ValueError: the demo and eval CLIs turn ValueErrors from reading problems (a JSON line that
    does not parse among them) into a bad-parameter message."""
