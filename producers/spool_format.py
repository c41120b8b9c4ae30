"""The spool's bytes on disk: segment and ack-file headers, record frames, and the scan that
finds every intact frame of a damaged segment.

    (used by producers.spool and producers.dead_letters; nothing here touches a file)

    seg-<id>.log    header (b"TTSPOOL2" + an 8-byte generation), then frames
    frame           magic b"\\xf1TT\\x1f", index u32, length u32, crc32 u32, body
                    (the crc covers index, length and body; body = topic_len u16, topic,
                    key_len u16, key, value; all integers little-endian)
    seg-<id>.acks   header (b"TTACKS02" + the generation of its segment), then the u32
                    indexes of the segment's delivered records

Each frame carries its own index and a magic, so a scan can step over damaged bytes to the
next intact frame and still know which record each one is (the acknowledgements name
records by index). The generation, random per segment, binds an ack file to its segment: an
ack file left behind by a segment that was removed never vouches for a new one with the same
id. Segments written before this format (no header; frames of length u32 and crc32 u32) are
read by `legacy_frames` and rewritten in this one.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field

SEGMENT_MAGIC = b"TTSPOOL2"
ACKS_MAGIC = b"TTACKS02"
HEADER_SIZE = 16  # magic + generation
FRAME_MAGIC = b"\xf1TT\x1f"
_FRAME = struct.Struct("<4sIII")  # magic, index, length, crc32(index, length, body)
_COVERED = struct.Struct("<II")  # the part of the header the crc covers
_LEGACY = struct.Struct("<II")  # length, crc32(body)
_LENS = struct.Struct("<H")
ACK = struct.Struct("<I")
FRAME_OVERHEAD = _FRAME.size


def new_generation() -> bytes:
    return os.urandom(8)


def segment_header(generation: bytes) -> bytes:
    return SEGMENT_MAGIC + generation


def acks_header(generation: bytes) -> bytes:
    return ACKS_MAGIC + generation


def generation_of(data: bytes, magic: bytes) -> bytes | None:
    """The generation in a segment's or ack file's header; None when the header is not there."""
    if len(data) >= HEADER_SIZE and data[:len(magic)] == magic:
        return data[len(magic):HEADER_SIZE]
    return None


def encode_body(topic: str, key: bytes, value: bytes) -> bytes:
    t = topic.encode()
    return b"".join((_LENS.pack(len(t)), t, _LENS.pack(len(key)), key, value))


def decode_body(body: bytes) -> tuple[str, bytes, bytes]:
    (tl,) = _LENS.unpack_from(body, 0)
    topic = body[2:2 + tl].decode()
    (kl,) = _LENS.unpack_from(body, 2 + tl)
    start = 4 + tl
    return topic, body[start:start + kl], body[start + kl:]


def frame(index: int, body: bytes) -> bytes:
    covered = _COVERED.pack(index, len(body))
    return FRAME_MAGIC + covered + struct.pack("<I", zlib.crc32(body, zlib.crc32(covered))) + body


def frame_header(header: bytes) -> tuple[int, int, int] | None:
    """(index, length, crc) of a frame header; None when it does not start with the magic."""
    magic, index, length, crc = _FRAME.unpack(header)
    return (index, length, crc) if magic == FRAME_MAGIC else None


def body_ok(index: int, length: int, crc: int, body: bytes) -> bool:
    return len(body) == length and zlib.crc32(body, zlib.crc32(_COVERED.pack(index, length))) == crc


def _frame_at(data: bytes, pos: int, after: int) -> tuple[int, int] | None:
    """(index, end) of an intact frame at `pos` whose index is above `after`, else None."""
    if pos + _FRAME.size > len(data):
        return None
    parsed = frame_header(data[pos:pos + _FRAME.size])
    if parsed is None or parsed[0] <= after:
        return None
    index, length, crc = parsed
    start = pos + _FRAME.size
    if not body_ok(index, length, crc, data[start:start + length]):
        return None
    return index, start + length


@dataclass
class Scan:
    """What a scan found: (index, offset) of each intact frame in order, and the byte ranges
    that belong to none. `torn_tail`: the last range is an incomplete frame, a write cut
    short (a crash or a full disk); the others are damaged records."""

    frames: list[tuple[int, int]] = field(default_factory=list)
    bad: list[tuple[int, int]] = field(default_factory=list)
    torn_tail: bool = False


def scan(data: bytes, start: int) -> Scan:
    """Every intact frame from `start`; past a bad one, resynchronise on the next frame magic
    that begins an intact frame with a higher index."""
    out, pos, last = Scan(), start, -1
    while pos < len(data):
        found = _frame_at(data, pos, last)
        if found is not None:
            out.frames.append((found[0], pos))
            last, pos = found
            continue
        nxt = data.find(FRAME_MAGIC, pos + 1)
        while nxt >= 0 and _frame_at(data, nxt, last) is None:
            nxt = data.find(FRAME_MAGIC, nxt + 1)
        end = len(data) if nxt < 0 else nxt
        out.bad.append((pos, end))
        out.torn_tail = nxt < 0 and _cut_short(data, pos)
        pos = end
    return out


def _cut_short(data: bytes, pos: int) -> bool:
    """Whether the bytes from `pos` to the end are the start of a frame that did not fit."""
    rest = data[pos:]
    if len(rest) < _FRAME.size:
        return FRAME_MAGIC.startswith(rest[:len(FRAME_MAGIC)])
    parsed = frame_header(rest[:_FRAME.size])
    return parsed is not None and _FRAME.size + parsed[1] > len(rest)


def legacy_frames(data: bytes) -> tuple[list[bytes], int] | None:
    """The bodies of a segment in the format before this one, up to its first bad frame, and
    where that frame starts; None when `data` does not start with such a frame."""
    bodies, pos = [], 0
    while pos + _LEGACY.size <= len(data):
        length, crc = _LEGACY.unpack_from(data, pos)
        body = data[pos + _LEGACY.size:pos + _LEGACY.size + length]
        if len(body) != length or zlib.crc32(body) != crc:
            break
        bodies.append(body)
        pos += _LEGACY.size + length
    return (bodies, pos) if bodies else None


def ack_indexes(data: bytes) -> list[int]:
    """The indexes of an ack file's entries (after its header); a partial last entry is left."""
    data = data[:len(data) - len(data) % ACK.size]
    return [i for (i,) in ACK.iter_unpack(data)]


def pack_acks(indexes) -> bytes:
    return b"".join(ACK.pack(i) for i in indexes)
