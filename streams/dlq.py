"""Dead-letter routing: a record that cannot be processed goes to `settings.topics.dlq` with
its original key and bytes and the headers of the one DLQ contract (`tracetrain.deadletter`:
source topic, partition, offset, reason tag, detail). Nothing is dropped silently; every route
is counted per reason. An original record too large for a record of this worker
(`streams.max_record_bytes`: the input topics may take larger ones, compressed) goes without
its value (and without its key if that is too large too), the detail saying so: it stays
readable at the source topic, partition and offset the headers name, and the worker is not
stopped by a send Kafka would refuse."""

from __future__ import annotations

from typing import Any

from streams.join_core import RECORD_OVERHEAD
from streams.metrics import StreamsMetrics
from tracetrain.deadletter import MAX_DETAIL_CHARS, dead_letter_headers


class DeadLetters:
    def __init__(self, topic: Any, metrics: StreamsMetrics, max_record_bytes: int):
        self.topic = topic
        self.metrics = metrics
        self.max_record_bytes = max_record_bytes

    async def send(self, key: bytes | None, value: bytes | None, *, source_topic: str,
                   partition: int, offset: int, reason: str, detail: str, force: bool = False) -> Any:
        """Queue the record; returns the delivery future (`force` sends now, not at commit)."""
        headers = dead_letter_headers(source_topic, partition, offset, reason=reason, detail=detail)
        size = len(key or b"") + len(value or b"") + sum(len(n) + len(v) for n, v in headers)
        if size + RECORD_OVERHEAD > self.max_record_bytes:
            cut = "value"
            if key is not None and len(key) + 2 * RECORD_OVERHEAD > self.max_record_bytes:
                cut, key = "key and value", None
            key = b"" if key is None else key  # aiokafka sends no record without both
            note = (f"[{cut} ({size} bytes with the headers) not copied: over "
                    f"streams.max_record_bytes {self.max_record_bytes}; read it at "
                    f"{source_topic}[{partition}]@{offset}] ")
            value = None
            headers = dead_letter_headers(source_topic, partition, offset, reason=reason,
                                          detail=note + detail[:MAX_DETAIL_CHARS - len(note)])
        self.metrics.dlq.labels(reason=reason).inc()
        return await self.topic.send(key=key, value=value, headers=headers, force=force)
