"""Errors of the serving stage. A request the engine refuses is the core's `BadRequest`, the
one the gateway raises too."""

from __future__ import annotations

from tracetrain.errors import TracetrainError


class ServingError(TracetrainError):
    """The engine or the reloader could not do what was asked."""


class LoadError(ServingError):
    """A checkpoint could not be loaded; the version that was serving keeps serving."""
