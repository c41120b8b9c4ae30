"""The schemas' error types: a schema folder that cannot be loaded, a message that cannot be
encoded or decoded."""

from __future__ import annotations

from tracetrain.errors import TracetrainError


class SchemasError(TracetrainError):
    """The schema history cannot be used; the message names the file or schema and what was
    expected."""


class CodecError(SchemasError):
    """A message could not be encoded or decoded. `reason` is a short machine-readable tag
    (used as the dead-letter reason); the message says what was wrong and what was expected."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(f"{reason}: {message}")
