"""The error hierarchy: one base, one subclass per package, wrapped with `raise ... from exc`."""

from __future__ import annotations


class TracetrainError(Exception):
    """Base of every error tracetrain raises on purpose."""


class ConfigError(TracetrainError):
    """Settings failed validation; carries every problem at once, each with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid settings:\n  - " + "\n  - ".join(problems))


class InfraError(TracetrainError):
    """The local stack could not be started, reached or stopped."""


class BadRequest(TracetrainError):
    """A request an HTTP service (gateway, reward API, OTLP receiver, engine) refuses: answered
    with `status` and an OpenAI-style error body whose message names the bad value and what was
    expected; `param` is the request field at fault, when there is one."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None):
        self.message, self.status, self.param = message, status, param
        super().__init__(message)


class Backpressure(TracetrainError):
    """A bounded queue is full; the caller may retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float):
        self.retry_after = retry_after
        super().__init__(message)
