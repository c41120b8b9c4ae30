"""The demo's and eval's error: a TracetrainError, and a ValueError too, because a bad
option (an unknown task, a missing problems file) is bad input the CLI reports as such."""

from tracetrain.errors import TracetrainError


class DemoError(TracetrainError, ValueError):
    """The demo or `tracetrain eval` was given something it cannot use."""
