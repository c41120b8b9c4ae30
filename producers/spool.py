"""The publisher's write-ahead spool: every record is on disk before `publish()` returns.

    (used by producers.publisher; state in $TRACETRAIN_HOME/spool/NAME/)

Layout of a spool folder: `seg-<id>.log` segments of framed records (append-only), one
`seg-<id>.acks` per segment listing the indexes of its delivered records, `quarantine/` for
bytes that start-up could not read as records, and `dead-letters.log` (producers.dead_letters).
The byte format is in producers.spool_format.
Records are written with one `os.write` each, so a record whose write returned survives a
`kill -9` of the process (the kernel holds it). Against power loss, `sync()` (called every
`fsync_interval_ms`) fsyncs the segments holding a record that has waited a whole interval
unacknowledged: records waiting on an unreachable or slow broker are on disk within two
intervals, and the records a healthy broker acknowledges within milliseconds, nearly all of
them, never force a disk write (their segment is usually removed before the kernel writes it
back). Fsyncing every record batch instead cost about a tenth of the publisher's throughput
(bench.producer with the spool on tmpfs against disk, same run).
A segment is removed once it is closed and every record in it is acknowledged. On start, the
segments a previous process left are scanned and their unacknowledged records are offered for
replay in the order they were written. Damage costs only the damaged records: the scan steps
over bad bytes to the next intact frame, moves the bad bytes to `quarantine/` (logged and
counted) and rewrites the segment without them. A folder is locked (flock) by one process at a
time.
Bounded: past `max_bytes` of segments, or when the disk is full, `append` raises `SpoolFull`
instead of taking a record it cannot keep; an acknowledgement the disk has no room for is
kept in memory and written with the next one (a crash meanwhile only repeats its record).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from producers import spool_format as fmt
from producers.errors import ProducerError, SpoolFull

log = logging.getLogger(__name__)

# errnos that mean "no room": a full disk or quota, or a file-size limit (RLIMIT_FSIZE)
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# Free bytes check_room wants beside the record: acknowledgements and a new segment need room.
DISK_HEADROOM = 64 * 1024
LOST = -1  # offset of a record whose bytes were damaged (quarantined; counts as done)


@dataclass
class Segment:
    id: int
    path: Path
    fd: int
    generation: bytes
    size: int = 0  # bytes in the file, header included
    written: int = 0  # records in the segment (the next record's index)
    offsets: list[int] = field(default_factory=list)  # start of record i's frame, or LOST
    acked: set[int] = field(default_factory=set)
    ack_fd: int = -1
    ack_size: int = 0  # bytes of the ack file known to be whole entries
    unwritten: list[int] = field(default_factory=list)  # acks the disk had no room for yet
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


class Spool:
    """Append records, read them back in order, acknowledge them, drop finished segments."""

    def __init__(self, folder: Path, segment_bytes: int = 64 * 1024 * 1024,
                 max_bytes: int | None = None, retry_after_s: float = 5.0,
                 on_quarantine: Callable[[int], None] | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.segment_bytes, self.max_bytes = segment_bytes, max_bytes
        self.retry_after_s = retry_after_s
        self._on_quarantine = on_quarantine or (lambda nbytes: None)
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
        self.bytes = 0  # of all segment files: what max_bytes bounds
        self.quarantined_bytes = 0
        self.no_room_since: float | None = None  # monotonic time of the last write without room
        self._lock = threading.Lock()  # segments dict and ack files (poll thread vs writers)
        self._dirty: set[int] = set()  # segments with records not fsynced, maybe unacked
        self._marks: dict[int, int] = {}  # records written per dirty segment at the last sync
        logs = sorted(self.folder.glob("seg-*.log"))
        for path in logs:
            self._load(int(path.stem.split("-")[1]), path)
        self._drop_orphan_acks({p.stem for p in logs})
        self.current = self._open_segment(max(self.segments, default=0) + 1)

    # -- start-up ----------------------------------------------------------------------------

    def _load(self, seg_id: int, path: Path) -> None:
        data = path.read_bytes()
        generation = fmt.generation_of(data, fmt.SEGMENT_MAGIC)
        legacy = fmt.legacy_frames(data) if generation is None else None
        acks = self._read_acks(path, generation, legacy is not None)
        if legacy is not None:
            bodies, end = legacy
            if end < len(data):
                self._quarantine(path, data[end:], end, torn=True)
            generation, data, frames = self._upgrade(path, bodies)
        else:
            found = fmt.scan(data, fmt.HEADER_SIZE if generation is not None else 0)
            frames = found.frames
            for lo, hi in found.bad:
                self._quarantine(path, data[lo:hi], lo, found.torn_tail and hi == len(data))
            if generation is None or found.bad:
                # Rewritten whole: the quarantined bytes are not found again at the next
                # start, and a segment whose header was damaged gets a fresh generation.
                generation, data, frames = self._rewrite(path, data, frames, generation)
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        seg = Segment(seg_id, path, fd, generation, size=len(data), closed=True)
        for index, offset in frames:
            seg.offsets.extend([LOST] * (index - len(seg.offsets)))
            seg.offsets.append(offset)
        seg.written = len(seg.offsets)
        seg.acked = {i for i in acks if i < seg.written}
        seg.acked.update(i for i, off in enumerate(seg.offsets) if off == LOST)
        seg.ack_fd, seg.ack_size = self._reopen_acks(path, generation, acks)
        self.bytes += seg.size
        self._advance(seg)
        self.segments[seg_id] = seg
        self._dirty.add(seg_id)  # a killed process may have left them in the page cache only
        self._maybe_remove(seg)

    def _quarantine(self, path: Path, raw: bytes, offset: int, torn: bool) -> None:
        folder = self.folder / "quarantine"
        folder.mkdir(exist_ok=True)
        target = folder / f"{path.stem}-at-{offset}.bad"
        target.write_bytes(raw)
        self.quarantined_bytes += len(raw)
        self._on_quarantine(len(raw))
        if torn:
            log.info("spool %s: a write cut short (crash or full disk) left %d bytes at the end; "
                     "moved to %s", path, len(raw), target)
        else:
            log.warning("spool %s: %d damaged bytes at offset %d are not a record; moved to %s, "
                        "the records after them are kept", path, len(raw), offset, target)

    @staticmethod
    def _read_acks(path: Path, generation: bytes | None, legacy: bool) -> list[int]:
        ack_path = path.with_suffix(".acks")
        if not ack_path.is_file():
            return []
        raw = ack_path.read_bytes()
        if legacy and fmt.generation_of(raw, fmt.ACKS_MAGIC) is None:
            return fmt.ack_indexes(raw)
        if generation is None or fmt.generation_of(raw, fmt.ACKS_MAGIC) != generation:
            if raw:
                log.warning("spool %s: ignored, its generation is not that of %s (left by a "
                            "segment removed earlier, or the segment's header is damaged); "
                            "the segment's records will be sent again", ack_path, path.name)
            return []
        return fmt.ack_indexes(raw[fmt.HEADER_SIZE:])

    def _reopen_acks(self, path: Path, generation: bytes, acks: list[int]) -> tuple[int, int]:
        """The ack file, rewritten when it was not whole entries of this segment's generation."""
        ack_path = path.with_suffix(".acks")
        want = fmt.acks_header(generation) + fmt.pack_acks(acks)
        have = ack_path.read_bytes() if ack_path.is_file() else b""
        if have != want:
            _write_whole(ack_path, want)
        return os.open(ack_path, os.O_WRONLY | os.O_APPEND), len(want)

    def _rewrite(self, path: Path, data: bytes, frames: list[tuple[int, int]],
                 generation: bytes | None) -> tuple[bytes, bytes, list[tuple[int, int]]]:
        generation = generation or fmt.new_generation()
        parts, out, pos = [fmt.segment_header(generation)], [], fmt.HEADER_SIZE
        for index, offset in frames:
            raw = _frame_bytes(data, offset)
            parts.append(raw)
            out.append((index, pos))
            pos += len(raw)
        new = b"".join(parts)
        try:
            _write_whole(path, new)
        except OSError as exc:  # no room to rewrite: keep reading the damaged file as it is
            log.warning("spool %s: could not rewrite it without its damaged bytes (%s)",
                        path, exc.strerror)
            return generation, data, frames
        return generation, new, out

    @staticmethod
    def _upgrade(path: Path, bodies: list[bytes]) -> tuple[bytes, bytes, list[tuple[int, int]]]:
        """A segment of the format before this one, rewritten in this one (same indexes)."""
        generation = fmt.new_generation()
        parts, frames, pos = [fmt.segment_header(generation)], [], fmt.HEADER_SIZE
        for index, body in enumerate(bodies):
            parts.append(fmt.frame(index, body))
            frames.append((index, pos))
            pos += len(parts[-1])
        data = b"".join(parts)
        try:
            _write_whole(path, data)
        except OSError as exc:
            raise ProducerError(f"spool {path}: cannot rewrite it in the current format "
                                f"({exc.strerror}); free some room and start again") from exc
        log.info("spool %s: rewritten in the current format (%d records)", path, len(bodies))
        return generation, data, frames

    def _drop_orphan_acks(self, live: set[str]) -> None:
        for ack_path in self.folder.glob("seg-*.acks"):
            if ack_path.stem not in live:  # its segment was removed by a process killed before
                ack_path.unlink(missing_ok=True)

    def _open_segment(self, seg_id: int) -> Segment:
        path = self.folder / f"seg-{seg_id:012d}.log"
        generation = fmt.new_generation()
        fd = ack_fd = -1
        try:
            # O_TRUNC: an ack file of this name left by an earlier segment starts over.
            ack_fd = os.open(path.with_suffix(".acks"),
                             os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_APPEND, 0o644)
            write_all(ack_fd, fmt.acks_header(generation))
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_APPEND, 0o644)
            write_all(fd, fmt.segment_header(generation))
        except OSError as exc:
            for f in (fd, ack_fd):
                if f >= 0:
                    os.close(f)
            if fd >= 0:
                path.unlink(missing_ok=True)
            raise self._no_room(exc, f"cannot start segment {path}") from exc
        seg = Segment(seg_id, path, fd, generation, size=fmt.HEADER_SIZE, ack_fd=ack_fd,
                      ack_size=fmt.HEADER_SIZE)
        self.segments[seg_id] = seg
        self.bytes += seg.size
        return seg

    # -- writing (caller holds the publisher's lock) ----------------------------------------

    def append(self, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
        """Write one record; returns (segment id, index). Durable against kill -9 on return.
        Raises SpoolFull (nothing written) past max_bytes or when the disk has no room."""
        seg = self.current
        if seg.size >= self.segment_bytes:
            seg = self._rotate()
        data = fmt.frame(seg.written, fmt.encode_body(topic, key, value))
        if self.max_bytes is not None and self.bytes + len(data) > self.max_bytes:
            seg = self._make_room(len(data))
        try:
            write_all(seg.fd, data)
        except OSError as exc:
            # A short write leaves part of the record: cut it off, or every record appended
            # after it would sit behind a torn frame.
            os.ftruncate(seg.fd, seg.size)
            raise self._no_room(exc, f"spool {seg.path}: cannot write a {len(data)}-byte "
                                     "record") from exc
        self.no_room_since = None
        seg.offsets.append(seg.size)
        seg.size += len(data)
        self.bytes += len(data)
        seg.written += 1
        self._dirty.add(seg.id)
        return seg.id, seg.written - 1

    def check_room(self, nbytes: int) -> None:
        """Raise SpoolFull now if a record of `nbytes` would pass max_bytes, or the disk has
        less than that and DISK_HEADROOM free, or was found full less than retry_after_s ago
        (no write has succeeded since)."""
        if self.max_bytes is not None and self.bytes + nbytes > self.max_bytes:
            raise self._full(nbytes)
        since = self.no_room_since
        fs = os.statvfs(self.folder)
        free = fs.f_bavail * fs.f_frsize
        if free < nbytes + DISK_HEADROOM:
            self.no_room_since = time.monotonic()
        elif since is None or time.monotonic() - since >= self.retry_after_s:
            return
        raise SpoolFull(f"the spool's disk is full ({free} bytes free at {self.folder}); it "
                        "was not published", retry_after=self.retry_after_s)

    def _make_room(self, nbytes: int) -> Segment:
        """The current segment, or a new one if dropping the current one (all delivered)
        makes room for `nbytes`; else SpoolFull."""
        seg = self.current
        if seg.written and seg.low >= seg.written:
            seg = self._rotate()
        if self.bytes + nbytes > self.max_bytes:
            raise self._full(nbytes)
        return seg

    def _full(self, nbytes: int) -> SpoolFull:
        return SpoolFull(
            f"the spool holds {self.bytes} bytes not yet delivered to Kafka and a "
            f"{nbytes}-byte record would pass its limit of {self.max_bytes} "
            "(publisher.spool_max_mb); it was not published", retry_after=self.retry_after_s)

    def _no_room(self, exc: OSError, what: str) -> ProducerError:
        if exc.errno in NO_ROOM:
            self.no_room_since = time.monotonic()
        return write_error(exc, what, self.retry_after_s)

    def _rotate(self) -> Segment:
        with self._lock:
            new = self._open_segment(self.current.id + 1)
            old, self.current = self.current, new
            old.closed = True  # its unacknowledged records stay dirty until sync() or acks
            self._maybe_remove(old)
            return self.current

    # -- reading ---------------------------------------------------------------------------

    def read(self, seg_id: int, index: int) -> Record | None:
        """The record at (seg_id, index); None when its bytes on disk were damaged since they
        were written: they are quarantined and the record counts as done."""
        seg = self.segments[seg_id]
        pos = seg.offsets[index]
        header = os.pread(seg.fd, fmt.FRAME_OVERHEAD, pos)
        parsed = fmt.frame_header(header) if len(header) == fmt.FRAME_OVERHEAD else None
        if parsed is not None and parsed[0] == index:
            body = os.pread(seg.fd, parsed[1], pos + fmt.FRAME_OVERHEAD)
            if fmt.body_ok(*parsed, body):
                return Record(seg_id, index, *fmt.decode_body(body))
        end = seg.offsets[index + 1] if index + 1 < seg.written else seg.size
        self._quarantine(seg.path, os.pread(seg.fd, end - pos, pos), pos, torn=False)
        self.ack_many([(seg_id, index)])
        return None

    def pending_from(self, seg_id: int, index: int) -> tuple[int, int] | None:
        """The next unacknowledged position at or after (seg_id, index), or None at the end."""
        with self._lock:
            ids = sorted(s for s in self.segments if s >= seg_id)
            for sid in ids:
                seg = self.segments[sid]
                start = max(index if sid == seg_id else 0, seg.low)
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
                self._write_acks(seg, seg.unwritten + indexes if seg.unwritten else indexes)
                self._advance(seg)
                self._maybe_remove(seg)

    def _write_acks(self, seg: Segment, indexes: list[int]) -> None:
        data = fmt.pack_acks(indexes)
        try:
            written = os.write(seg.ack_fd, data)
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise
            written = 0
        if written == len(data):
            seg.ack_size += written
            seg.unwritten = []
            return
        # A partial entry would shift every later one onto the wrong record: cut it off and
        # keep these acknowledgements in memory until the disk has room.
        os.ftruncate(seg.ack_fd, seg.ack_size)
        seg.unwritten = indexes
        self.no_room_since = time.monotonic()
        log.warning("spool %s: no room to record %d deliveries; kept in memory and retried",
                    seg.path.with_suffix(".acks"), len(indexes))

    def _maybe_remove(self, seg: Segment) -> None:
        if seg.closed and len(seg.acked) >= seg.written:
            os.close(seg.fd)
            os.close(seg.ack_fd)
            # The segment first: a kill between the two leaves an ack file whose generation
            # matches no segment (dropped at the next start), never records without acks.
            seg.path.unlink(missing_ok=True)
            seg.path.with_suffix(".acks").unlink(missing_ok=True)
            self.segments.pop(seg.id, None)
            self.bytes -= seg.size
            self._dirty.discard(seg.id)
            self._marks.pop(seg.id, None)

    @staticmethod
    def _advance(seg: Segment) -> None:
        while seg.low < seg.written and seg.low in seg.acked:
            seg.low += 1

    def sync(self, everything: bool = False) -> int:
        """fsync each segment holding an unacknowledged record that was written before the
        last call (or, with `everything`, any unacknowledged record); write acknowledgements
        a full disk held back. Returns the segments fsynced."""
        done = 0
        with self._lock:
            for seg in self.segments.values():
                if seg.unwritten:
                    self._write_acks(seg, seg.unwritten)
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


def _frame_bytes(data: bytes, offset: int) -> bytes:
    parsed = fmt.frame_header(data[offset:offset + fmt.FRAME_OVERHEAD])
    return data[offset:offset + fmt.FRAME_OVERHEAD + parsed[1]]


def write_all(fd: int, data: bytes) -> None:
    """One os.write; a short one (only when there is no room) raises ENOSPC."""
    if os.write(fd, data) != len(data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def write_error(exc: OSError, what: str, retry_after_s: float) -> ProducerError:
    """SpoolFull when a write failed for want of room (the caller may retry), else the error."""
    if exc.errno in NO_ROOM:
        return SpoolFull(f"{what}: {exc.strerror} (disk full?); it was not published",
                         retry_after=retry_after_s)
    return ProducerError(f"{what} ({exc.strerror}); it was not published")


def _write_whole(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (a crash leaves the old file or the new one)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    except OSError:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
