"""Dead-letter routing: a record that cannot be processed goes to `settings.topics.dlq` with
its original key and bytes and headers naming where it came from and why:
`source_topic`, `partition`, `offset`, `reason` (machine-readable) and `error` (the message).
Nothing is dropped silently; every route is counted per reason."""

from __future__ import annotations

from typing import Any

from streams.metrics import StreamsMetrics


class DeadLetters:
    def __init__(self, topic: Any, metrics: StreamsMetrics):
        self.topic = topic
        self.metrics = metrics

    async def send(self, key: bytes | None, value: bytes | None, *, source_topic: str,
                   partition: int, offset: int, reason: str, error: str, force: bool = False) -> Any:
        """Queue the record; returns the delivery future (`force` sends now, not at commit)."""
        headers = [("source_topic", source_topic.encode()), ("partition", str(partition).encode()),
                   ("offset", str(offset).encode()), ("reason", reason.encode()),
                   ("error", error.encode(errors="replace"))]
        self.metrics.dlq.labels(reason=reason).inc()
        return await self.topic.send(key=key, value=value, headers=headers, force=force)


def headers_dict(headers: Any) -> dict[str, str]:
    """Headers of a consumed DLQ record (a list of pairs or a mapping) as text."""
    pairs = headers.items() if isinstance(headers, dict) else (headers or [])
    return {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in pairs}
