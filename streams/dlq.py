"""Dead-letter routing: a record that cannot be processed goes to `settings.topics.dlq` with
its original key and bytes and the headers of the one DLQ contract (`tracetrain.deadletter`:
source topic, partition, offset, reason tag, detail). Nothing is dropped silently; every route
is counted per reason."""

from __future__ import annotations

from typing import Any

from streams.metrics import StreamsMetrics
from tracetrain.deadletter import dead_letter_headers


class DeadLetters:
    def __init__(self, topic: Any, metrics: StreamsMetrics):
        self.topic = topic
        self.metrics = metrics

    async def send(self, key: bytes | None, value: bytes | None, *, source_topic: str,
                   partition: int, offset: int, reason: str, detail: str, force: bool = False) -> Any:
        """Queue the record; returns the delivery future (`force` sends now, not at commit)."""
        headers = dead_letter_headers(source_topic, partition, offset, reason=reason, detail=detail)
        self.metrics.dlq.labels(reason=reason).inc()
        return await self.topic.send(key=key, value=value, headers=headers, force=force)
