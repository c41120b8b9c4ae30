"""How the gateway records a call's span: once the upstream has answered, the agent gets its
answer whatever the publisher says.

A publish that fails at that point (the publisher busy past `publisher.max_block_ms`, its
spool or disk full, the publisher closing) must not turn the agent's answered call into a 500.
The span is held in memory, in order, and a background task hands the held spans to the same
publisher (whose `publish` writes each to its spool before sending it) with backoff until it
takes them. While any span is held, new ones queue behind it, so a rollout's spans keep their
order. At `gateway.held_spans_max` held spans, `check_room` refuses new calls (503 with
Retry-After) before they reach the upstream. What is still held when the gateway stops is
handed over once more and, if refused again, logged with its count.

A span the publisher refuses for good (one that cannot be encoded, e.g. an upstream answer
with a lone surrogate) would be refused on every retry: an error span with its ids, times and
the reason is recorded in its place, so the rollout still shows the call. (One larger than
Kafka takes is not refused: the publisher moves it to its dead-letter file and counts it.)
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from producers.records import llm_part, new_span
from schemas.errors import CodecError
from tracetrain.errors import Backpressure, TracetrainError
from tracetrain.observability import Metrics

log = logging.getLogger(__name__)

_RETRY_FIRST_S, _RETRY_MAX_S = 0.05, 5.0
# The attributes an error span keeps of the span it replaces: small, plain strings.
_KEPT_ATTRIBUTES = ("http.status_code", "gateway.endpoint", "stream", "rollout_id_generated")


def _refused_for_good(exc: Exception) -> bool:
    return isinstance(exc, CodecError)


def replacement(span: dict, reason: str) -> dict:
    """An error span standing for `span`, which could not be published as it was."""
    text = reason.encode("utf-8", "backslashreplace").decode()[:2000]
    attrs = {k: v for k, v in span["attributes"].items() if k in _KEPT_ATTRIBUTES}
    attrs["gateway.replaced"] = "true"
    return new_span(
        span["kind"], span["rollout_id"], trace_id=span["trace_id"], span_id=span["span_id"],
        parent_id=span["parent_id"], attempt_id=span["attempt_id"], task_id=span["task_id"],
        agent_name=span["agent_name"], policy_name=span["policy_name"],
        start_time_ns=span["start_time_ns"], end_time_ns=span["end_time_ns"], status="error",
        error_message=f"the call's span could not be published as it was, so its request and "
                      f"response are left out: {text}",
        service=span["resource"].get("service", ""), attributes=attrs,
        llm=llm_part(model="") if span.get("llm") is not None else None)


class SpanRecorder:
    """Publishes the gateway's spans; holds the ones the publisher refuses for now."""

    def __init__(self, metrics: Metrics, held_max: int):
        self.publisher = None  # set by `start`, in the app's lifespan
        self._held: deque[dict] = deque()
        self._held_max = held_max
        self._wake = asyncio.Event()
        self._last_error = ""
        self._held_total = metrics.counter(
            "held", "records", "Spans the publisher refused after the upstream had answered, "
            "held by the gateway and published later.")
        self._waiting = metrics.gauge("waiting", "records",
                                      "Held spans the publisher has not taken yet.")
        self._waiting.set_function(lambda: len(self._held))
        self._replaced = metrics.counter(
            "replaced", "records", "Spans the publisher refused for good (not encodable), "
            "recorded as error spans in their place.")

    @property
    def held(self) -> int:
        return len(self._held)

    def start(self, publisher) -> asyncio.Task:
        self.publisher = publisher
        return asyncio.create_task(self._run(), name="gateway-held-spans")

    def check_room(self) -> None:
        """Backpressure (a 503 with Retry-After) while `held_max` spans wait."""
        if len(self._held) >= self._held_max:
            raise Backpressure(f"{len(self._held)} spans wait for the publisher "
                               f"({self._last_error}); retry later", retry_after=1.0)

    def record(self, span: dict) -> None:
        """Publish `span`, or hold it behind those already held. Never raises."""
        if not self._held and self._publish(span):
            return
        self._held.append(span)
        self._held_total.inc()
        self._wake.set()

    def close(self) -> None:
        """At shutdown: hand the held spans over once more; what is refused is lost, logged."""
        while self._held and self._publish(self._held[0]):
            self._held.popleft()
        if self._held:
            log.error("gateway stopped with %d spans the publisher refused (%s): they are lost",
                      len(self._held), self._last_error)

    def _publish(self, span: dict, replacing: bool = False) -> bool:
        """True once the publisher took `span` (or its replacement); False to hold it."""
        try:
            self.publisher.publish_span(span)
            return True
        except (TracetrainError, OSError) as exc:
            if not _refused_for_good(exc):
                self._last_error = f"{type(exc).__name__}: {exc}"
                return False
            self._replaced.inc()
            if replacing:  # the replacement is plain ASCII and small; this is a bug
                log.exception("gateway could not record the error span of %s",
                              span["span_id"])
                return True
            log.error("span %s of rollout %s refused for good, recorded as an error span: %s",
                      span["span_id"], span["rollout_id"], exc)
            return self._publish(replacement(span, str(exc)), replacing=True)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            delay = _RETRY_FIRST_S
            while self._held:
                if self._publish(self._held[0]):
                    self._held.popleft()
                    delay = _RETRY_FIRST_S
                    continue
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)
