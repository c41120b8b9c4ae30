"""The publisher's local dead-letter file: records Kafka refuses for good, kept aside.

    letters = read_dead_letters(home / "spool" / "gateway" / "dead-letters.log")
    letters[0].reason, letters[0].topic, letters[0].key, letters[0].value

A record larger than Kafka takes (a huge tool result, a long RAG context) cannot go to any
topic, the dead-letter topic included, and must not block the records behind it: the
publisher moves it here, with the reason, counts it (`tracetrain_publisher_output_records
{outcome="dead_lettered"}`) and goes on. Frames as in the spool (producers.spool_format);
the body is the reason (u16 length, text) followed by the spooled record's body. Each letter
is fsynced before the spool forgets its record. Nothing replays this file.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from producers import spool_format as fmt
from producers.spool import write_all, write_error

_LEN = struct.Struct("<H")
MAX_REASON = 2000


@dataclass(frozen=True)
class DeadLetter:
    reason: str
    topic: str
    key: bytes
    value: bytes


class DeadLetterFile:
    """Append-only; written from the publisher's lock or its delivery thread, one at a time."""

    def __init__(self, path: Path, retry_after_s: float = 5.0):
        self.path = Path(path)
        self.retry_after_s = retry_after_s
        frames = fmt.scan(self.path.read_bytes(), 0).frames if self.path.is_file() else []
        self.next_index = frames[-1][0] + 1 if frames else 0

    def append(self, reason: str, topic: str, key: bytes, value: bytes) -> None:
        """Keep one refused record. Raises SpoolFull (nothing kept) when the disk has no room."""
        why = reason[:MAX_REASON].encode(errors="replace")
        data = fmt.frame(self.next_index,
                         _LEN.pack(len(why)) + why + fmt.encode_body(topic, key, value))
        fd = os.open(self.path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                write_all(fd, data)
                os.fsync(fd)
            except OSError as exc:
                os.ftruncate(fd, size)  # no partial letter in front of the next one
                raise write_error(exc, f"dead-letter file {self.path}: cannot keep a "
                                       f"{len(data)}-byte record", self.retry_after_s) from exc
        finally:
            os.close(fd)
        self.next_index += 1


def read_dead_letters(path: Path) -> list[DeadLetter]:
    """Every letter of a dead-letter file, in the order they were written."""
    data = Path(path).read_bytes()
    out = []
    for _index, offset in fmt.scan(data, 0).frames:
        _i, length, _crc = fmt.frame_header(data[offset:offset + fmt.FRAME_OVERHEAD])
        body = data[offset + fmt.FRAME_OVERHEAD:offset + fmt.FRAME_OVERHEAD + length]
        (n,) = _LEN.unpack_from(body, 0)
        out.append(DeadLetter(body[2:2 + n].decode(errors="replace"),
                              *fmt.decode_body(body[2 + n:])))
    return out
