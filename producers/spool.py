"""The publisher's write-ahead spool: every record is on disk before `publish()` returns.

    (used by producers.publisher; state in $TRACETRAIN_HOME/spool/NAME/)

Layout of a spool folder: `seg-<id>.log` segments of framed records (append-only) and one
`seg-<id>.acks` per segment listing the indexes of its delivered records (4 bytes each).
Records are written with one `os.write` each, so a record whose write returned survives a
`kill -9` of the process (the kernel holds it). Against power loss, `sync()` (called every
`fsync_interval_ms`) fsyncs the segments holding a record that has waited a whole interval
unacknowledged: records waiting on an unreachable or slow broker are on disk within two
intervals, and the records a healthy broker acknowledges within milliseconds, nearly all of
them, never force a disk write (their segment is usually removed before the kernel writes it
back). Fsyncing every record batch instead cost about a tenth of the publisher's throughput
(bench.producer with the spool on tmpfs against disk, same run).
A segment is removed once it is closed and every record in it is acknowledged. On start, the
segments a previous process left are scanned (a torn last record, written by a publish call
that never returned, is cut off) and their unacknowledged records are offered for replay in
the order they were written. A folder is locked (flock) by one process at a time.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from producers.errors import ProducerError

# length of the body, crc32 of the body; body = topic_len(u16) topic key_len(u16) key value
_FRAME = struct.Struct("<II")
_LENS = struct.Struct("<H")
_ACK = struct.Struct("<I")


@dataclass
class Segment:
    id: int
    path: Path
    fd: int
    size: int = 0
    written: int = 0  # records in the segment
    offsets: list[int] = field(default_factory=list)  # start of record i (replay and retries)
    acked: set[int] = field(default_factory=set)
    ack_fd: int = -1
    closed: bool = False
    low: int = 0  # every record before this index is acknowledged
    synced: int = 0  # records before this index were fsynced (or acknowledged first)


@dataclass(frozen=True)
class Record:
    segment: int
    index: int
    topic: str
    key: bytes
    value: bytes


def encode_body(topic: str, key: bytes, value: bytes) -> bytes:
    t = topic.encode()
    return b"".join((_LENS.pack(len(t)), t, _LENS.pack(len(key)), key, value))


def decode_body(body: bytes) -> tuple[str, bytes, bytes]:
    (tl,) = _LENS.unpack_from(body, 0)
    topic = body[2:2 + tl].decode()
    (kl,) = _LENS.unpack_from(body, 2 + tl)
    start = 4 + tl
    return topic, body[start:start + kl], body[start + kl:]


class Spool:
    """Append records, read them back in order, acknowledge them, drop finished segments."""

    def __init__(self, folder: Path, segment_bytes: int = 64 * 1024 * 1024):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._lock_fd = os.open(self.folder / "LOCK", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise ProducerError(
                f"spool {self.folder} is locked by another live process; give each publisher "
                "its own spool name (Publisher(..., name=...))"
            ) from exc
        self.segments: dict[int, Segment] = {}
        self._lock = threading.Lock()  # segments dict and ack files (poll thread vs writers)
        self._dirty: set[int] = set()  # segments with records not fsynced, maybe unacked
        self._marks: dict[int, int] = {}  # records written per dirty segment at the last sync
        for path in sorted(self.folder.glob("seg-*.log")):
            self._load(int(path.stem.split("-")[1]), path)
        self.current = self._open_segment(max(self.segments, default=0) + 1)

    # -- start-up ----------------------------------------------------------------------------

    def _load(self, seg_id: int, path: Path) -> None:
        fd = os.open(path, os.O_RDWR)
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        seg = Segment(seg_id, path, fd, closed=True)
        pos = 0
        while pos + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, pos)
            body = data[pos + _FRAME.size:pos + _FRAME.size + length]
            if len(body) != length or zlib.crc32(body) != crc:
                break
            seg.offsets.append(pos)
            pos += _FRAME.size + length
        if pos != len(data):
            # A torn tail: the publish call writing it never returned, so it was never promised.
            os.ftruncate(fd, pos)
        seg.size, seg.written = pos, len(seg.offsets)
        ack_path = path.with_suffix(".acks")
        if ack_path.is_file():
            raw = ack_path.read_bytes()
            raw = raw[: len(raw) - len(raw) % _ACK.size]
            seg.acked = {i for (i,) in _ACK.iter_unpack(raw)}
        seg.ack_fd = os.open(ack_path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        self._advance(seg)
        self.segments[seg_id] = seg
        self._dirty.add(seg_id)  # a killed process may have left them in the page cache only
        self._maybe_remove(seg)

    def _open_segment(self, seg_id: int) -> Segment:
        path = self.folder / f"seg-{seg_id:012d}.log"
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_APPEND, 0o644)
        ack_fd = os.open(path.with_suffix(".acks"), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        seg = Segment(seg_id, path, fd, ack_fd=ack_fd)
        self.segments[seg_id] = seg
        return seg

    # -- writing (caller holds the publisher's lock) ----------------------------------------

    def append(self, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
        """Write one record; returns (segment id, index). Durable against kill -9 on return."""
        seg = self.current
        if seg.size >= self.segment_bytes:
            seg = self._rotate()
        body = encode_body(topic, key, value)
        frame = _FRAME.pack(len(body), zlib.crc32(body)) + body
        try:
            written = os.write(seg.fd, frame)
        except OSError as exc:
            raise ProducerError(f"spool {seg.path}: cannot write a {len(frame)}-byte record "
                                f"({exc.strerror}); it was not published") from exc
        if written != len(frame):
            # Short only when the disk is full. Cut the partial record off, or every record
            # appended after it would sit behind a torn frame that start-up stops reading at.
            os.ftruncate(seg.fd, seg.size)
            raise ProducerError(f"spool {seg.path}: only {written} of a {len(frame)}-byte "
                                "record fit (disk full?); it was not published")
        seg.offsets.append(seg.size)
        seg.size += len(frame)
        seg.written += 1
        self._dirty.add(seg.id)
        return seg.id, seg.written - 1

    def _rotate(self) -> Segment:
        with self._lock:
            old = self.current
            old.closed = True  # its unacknowledged records stay dirty until sync() or acks
            self.current = self._open_segment(old.id + 1)
            self._maybe_remove(old)
            return self.current

    # -- reading ---------------------------------------------------------------------------

    def read(self, seg_id: int, index: int) -> Record:
        seg = self.segments[seg_id]
        pos = seg.offsets[index]
        length, _crc = _FRAME.unpack(os.pread(seg.fd, _FRAME.size, pos))
        topic, key, value = decode_body(os.pread(seg.fd, length, pos + _FRAME.size))
        return Record(seg_id, index, topic, key, value)

    def pending_from(self, seg_id: int, index: int) -> tuple[int, int] | None:
        """The next unacknowledged position at or after (seg_id, index), or None at the end."""
        with self._lock:
            ids = sorted(s for s in self.segments if s >= seg_id)
            for sid in ids:
                seg = self.segments[sid]
                start = index if sid == seg_id else 0
                for i in range(start, seg.written):
                    if i not in seg.acked:
                        return sid, i
        return None

    def unacked(self) -> int:
        with self._lock:
            return sum(s.written - len(s.acked) for s in self.segments.values())

    # -- acknowledging (poll thread) --------------------------------------------------------

    def ack_many(self, done: list[tuple[int, int]]) -> None:
        """Record deliveries: one os.write per segment per batch (kill -9 safe on return)."""
        by_seg: dict[int, list[int]] = {}
        for sid, i in done:
            by_seg.setdefault(sid, []).append(i)
        with self._lock:
            for sid, indexes in by_seg.items():
                seg = self.segments.get(sid)
                if seg is None:
                    continue
                seg.acked.update(indexes)
                # Not fsynced on its own: a lost acknowledgement only repeats its record on
                # replay (at-least-once across crashes); sync() writes it with the records.
                os.write(seg.ack_fd, b"".join(_ACK.pack(i) for i in indexes))
                self._advance(seg)
                self._maybe_remove(seg)

    def _maybe_remove(self, seg: Segment) -> None:
        if seg.closed and len(seg.acked) >= seg.written:
            os.close(seg.fd)
            os.close(seg.ack_fd)
            seg.path.unlink(missing_ok=True)
            seg.path.with_suffix(".acks").unlink(missing_ok=True)
            self.segments.pop(seg.id, None)
            self._dirty.discard(seg.id)
            self._marks.pop(seg.id, None)

    @staticmethod
    def _advance(seg: Segment) -> None:
        while seg.low < seg.written and seg.low in seg.acked:
            seg.low += 1

    def sync(self, everything: bool = False) -> int:
        """fsync each segment holding an unacknowledged record that was written before the
        last call (or, with `everything`, any unacknowledged record). Returns the segments
        fsynced."""
        done = 0
        with self._lock:
            marks, self._marks = self._marks, {}
            for sid in sorted(self._dirty):
                seg = self.segments[sid]
                start = max(seg.low, seg.synced)
                until = seg.written if everything else min(marks.get(sid, 0), seg.written)
                waiting = next((i for i in range(start, until) if i not in seg.acked), None)
                if waiting is not None:
                    os.fsync(seg.fd)
                    os.fsync(seg.ack_fd)
                    seg.synced, done = seg.written, done + 1
                if max(seg.low, seg.synced) < seg.written:
                    self._marks[sid] = seg.written  # asked again at the next call
                else:
                    self._dirty.discard(sid)
        return done

    def close(self) -> None:
        self.sync(everything=True)
        with self._lock:
            self.current.closed = True
            for seg in list(self.segments.values()):
                self._maybe_remove(seg)
            for seg in self.segments.values():
                os.close(seg.fd)
                os.close(seg.ack_fd)
            self.segments.clear()
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
