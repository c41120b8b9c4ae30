"""The producers' error type: publisher, spool, gateway and tracer failures."""

from __future__ import annotations

from tracetrain.errors import TracetrainError


class ProducerError(TracetrainError):
    """A span or reward could not be accepted; the message says which value and why."""
