"""The streams' error type: settings the join cannot run with, replays that cannot finish."""

from __future__ import annotations

from tracetrain.errors import TracetrainError


class StreamsError(TracetrainError):
    """The stream processing cannot go on; the message names the bad value and what was expected.
    (A bad record is no error: it goes to the DLQ.)"""
