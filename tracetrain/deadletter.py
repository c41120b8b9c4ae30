"""The dead-letter contract: the headers every stage puts on a record it sends to the DLQ.

    producer.produce(topics.dlq, key=key, value=value,
                     headers=dead_letter_headers(msg.topic(), msg.partition(), msg.offset(),
                                                 reason="bad_magic", detail=str(exc)))
    letter = read_dead_letter_headers(consumed.headers())   # letter["reason"] == "bad_magic"

A dead letter keeps its original key and bytes; the headers say where it came from and why:
`source_topic`, `partition`, `offset` (-1 when the record was made by the stage, such as a
timed-out rollout's summary), `reason` (a short machine-readable tag, the label of the stage's
DLQ counter) and `detail` (the message: the bad value and what was expected).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypedDict

SOURCE_TOPIC = "source_topic"
PARTITION = "partition"
OFFSET = "offset"
REASON = "reason"
DETAIL = "detail"
HEADER_NAMES: tuple[str, ...] = (SOURCE_TOPIC, PARTITION, OFFSET, REASON, DETAIL)

# Kafka headers are small by convention; a parse error can quote a whole record.
MAX_DETAIL_CHARS = 500


class DeadLetter(TypedDict):
    """The headers of a consumed dead letter, typed."""

    source_topic: str
    partition: int
    offset: int
    reason: str
    detail: str


def dead_letter_headers(source_topic: str, partition: int, offset: int, *, reason: str,
                        detail: str) -> list[tuple[str, bytes]]:
    """The headers of one dead letter, in `HEADER_NAMES` order, as Kafka clients take them."""
    values = (source_topic, str(partition), str(offset), reason, detail[:MAX_DETAIL_CHARS])
    return [(name, value.encode(errors="replace"))
            for name, value in zip(HEADER_NAMES, values, strict=True)]


def read_dead_letter_headers(
    headers: Iterable[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None,
) -> DeadLetter:
    """The contract's headers of a consumed record (a list of pairs, as confluent-kafka and Faust
    give them, or a mapping); a header that is missing reads as "" (or -1 for the numbers)."""
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or [])
    text = {name: value.decode(errors="replace") if isinstance(value, bytes) else (value or "")
            for name, value in pairs}
    return DeadLetter(source_topic=text.get(SOURCE_TOPIC, ""),
                      partition=int(text.get(PARTITION) or -1),
                      offset=int(text.get(OFFSET) or -1),
                      reason=text.get(REASON, ""), detail=text.get(DETAIL, ""))
