"""The producers' error types: publisher, spool, gateway and tracer failures."""

from __future__ import annotations

from tracetrain.errors import Backpressure, TracetrainError


class ProducerError(TracetrainError):
    """A span or reward could not be accepted; the message says which value and why."""


class RecordTooLarge(ProducerError):
    """A record larger than Kafka takes (the producer's message.max.bytes or the topic's
    max.message.bytes, whichever is smaller); `limit` is the largest key + value it takes."""

    def __init__(self, message: str, limit: int):
        self.limit = limit
        super().__init__(message)


class SpoolFull(ProducerError, Backpressure):
    """The spool is at its size limit (publisher.spool_max_mb) or its disk is full: the record
    was not accepted; retry after `retry_after` seconds, once deliveries have made room."""

    def __init__(self, message: str, retry_after: float):
        Backpressure.__init__(self, message, retry_after)


class NoHealthyEngine(ProducerError, Backpressure):
    """Every engine of the gateway's pool is out (each failed a call or a probe): the call was
    not sent; retry after `retry_after` seconds, when the next probe may have taken one back."""

    def __init__(self, message: str, retry_after: float):
        Backpressure.__init__(self, message, retry_after)
