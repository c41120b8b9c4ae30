"""Errors of the serving stage."""

from __future__ import annotations

from tracetrain.errors import TracetrainError


class ServingError(TracetrainError):
    """The engine or the reloader could not do what was asked."""


class BadRequest(ServingError):
    """A request the engine refuses (answered with HTTP 400 and this message)."""


class LoadError(ServingError):
    """A checkpoint could not be loaded; the version that was serving keeps serving."""
