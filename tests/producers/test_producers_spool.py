"""The spool on its own: records read back in order, a torn tail is cut off, acknowledged
segments disappear, a second process cannot open a locked spool."""

from __future__ import annotations

import pytest

from producers.errors import ProducerError
from producers.spool import Spool
from tracetrain.errors import Backpressure


def replayed(spool: Spool) -> list[bytes]:
    """The values a restarted publisher would replay, in order."""
    pos, values = spool.pending_from(0, 0), []
    while pos is not None:
        values.append(spool.read(*pos).value)
        pos = spool.pending_from(pos[0], pos[1] + 1)
    return values


def test_replay_skips_acked_and_cuts_torn_tail(tmp_path):
    spool = Spool(tmp_path)
    for i in range(10):
        spool.append("t", f"k{i % 3}".encode(), f"v{i}".encode())
    spool.ack_many([(1, 0), (1, 1), (1, 5)])
    path = spool.current.path
    spool.sync()
    # Simulate a kill -9 in the middle of a write: half a frame at the end.
    with open(path, "ab") as f:
        f.write(b"\x40\x00\x00\x00garbage")
    # Release the lock as the kernel would for a killed process.
    import fcntl
    import os
    fcntl.flock(spool._lock_fd, fcntl.LOCK_UN)
    os.close(spool._lock_fd)

    again = Spool(tmp_path)
    assert [v.decode() for v in replayed(again)] == [f"v{i}" for i in (2, 3, 4, 6, 7, 8, 9)]
    assert again.unacked() == 7
    again.ack_many([(1, i) for i in (2, 3, 4, 6, 7, 8, 9)])
    assert not path.exists(), "a closed, fully acknowledged segment must be removed"
    again.close()


def test_locked_spool_is_refused(tmp_path):
    first = Spool(tmp_path)
    with pytest.raises(ProducerError, match="locked"):
        Spool(tmp_path)
    first.close()


def test_only_records_left_waiting_an_interval_are_fsynced(tmp_path, monkeypatch):
    import os

    fsynced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsynced.append(fd), real_fsync(fd))[1])
    spool = Spool(tmp_path)
    seg = spool.current
    # Delivered before the next interval: never forced to disk.
    spool.append("t", b"k", b"fast")
    assert spool.sync() == 0
    spool.ack_many([(seg.id, 0)])
    assert spool.sync() == 0 and fsynced == []
    # Still unacknowledged one interval after it was written: fsynced (data and acks), once.
    spool.append("t", b"k", b"waits")
    assert spool.sync() == 0  # written in this interval: too young
    assert spool.sync() == 1 and fsynced == [seg.fd, seg.ack_fd]
    assert spool.sync() == 0  # already on disk
    # Newer records of the same segment are judged on their own age.
    spool.append("t", b"k", b"later")
    assert spool.sync() == 0 and spool.sync() == 1
    # A clean close leaves what is unacknowledged on disk for the next start, whatever its age.
    spool.append("t", b"k", b"last")
    fsynced.clear()
    spool.close()
    assert fsynced, "close must fsync the unacknowledged records it leaves"
    again = Spool(tmp_path)
    assert again.unacked() == 3
    again.close()


def test_a_full_disk_refuses_the_record_and_keeps_later_ones_readable(tmp_path):
    """A file-size limit (RLIMIT_FSIZE, in a child process) makes the kernel write part of a
    record, as a full disk would: that record is refused, and records appended once there is
    room again are read back after a restart, not lost behind the torn one."""
    import subprocess
    import sys

    child = f"""
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from producers.errors import ProducerError
from producers.spool import Spool
from tracetrain.errors import Backpressure
spool = Spool({str(tmp_path)!r})
resource.setrlimit(resource.RLIMIT_FSIZE, (5000, resource.RLIM_INFINITY))
for i in range(6):
    try:
        spool.append("t", b"k", bytes([i]) * 1000)
        print("kept", i)
    except ProducerError as exc:
        print("refused", i, exc)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
spool.append("t", b"k", bytes([9]) * 1000)
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    assert "kept 3" in out and "kept 4" not in out, out
    assert "refused 4" in out and "disk full?" in out and "refused 5" in out, out
    again = Spool(tmp_path)
    assert [v[0] for v in replayed(again)] == [0, 1, 2, 3, 9]
    again.close()


def abandon(spool: Spool) -> None:
    """What a kill -9 leaves: the files as they are, descriptors closed, the lock released."""
    import fcntl
    import os

    for seg in spool.segments.values():
        os.close(seg.fd)
        os.close(seg.ack_fd)
    fcntl.flock(spool._lock_fd, fcntl.LOCK_UN)
    os.close(spool._lock_fd)


@pytest.mark.parametrize("where", ["body", "length"])
def test_a_damaged_record_costs_only_itself(tmp_path, caplog, where):
    """One flipped byte in record 10 of 100: start-up keeps the 99 others, in order, and moves
    the bad bytes to quarantine/ with a log line; the next start finds nothing bad."""
    import logging

    spool = Spool(tmp_path)
    values = [b"value-%03d|" % i * 5 for i in range(100)]
    for value in values:
        spool.append("t", b"key", value)
    path = spool.current.path
    abandon(spool)
    data = bytearray(path.read_bytes())
    at = data.find(values[10])
    # In the body, or the low byte of the frame's length field: 8 bytes before the body,
    # which starts with topic and key and their u16 lengths.
    data[at + 7 if where == "body" else at - 8 - 8] ^= 0x40
    path.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="producers.spool"):
        again = Spool(tmp_path)
    assert replayed(again) == values[:10] + values[11:]
    [bad] = (tmp_path / "quarantine").glob("*.bad")
    kept = bad.read_bytes()
    assert values[9] not in kept and values[11] not in kept and len(kept) > len(values[10])
    assert again.quarantined_bytes == len(kept)
    assert any("damaged" in r.message and str(bad) in r.message for r in caplog.records)
    abandon(again)
    third = Spool(tmp_path)  # the segment was rewritten without the bad bytes
    assert third.quarantined_bytes == 0 and replayed(third) == values[:10] + values[11:]
    third.close()


def test_an_orphan_ack_file_does_not_vouch_for_a_new_segment(tmp_path):
    """A kill -9 between the two unlinks of a delivered segment leaves its .acks file; the
    next segment with the same id must not count its own records as delivered."""
    spool = Spool(tmp_path)
    for i in range(3):
        spool.append("t", b"k", b"old%d" % i)
    acks = spool.current.path.with_suffix(".acks")
    spool.ack_many([(spool.current.id, i) for i in range(3)])
    orphan = acks.read_bytes()
    spool.close()  # everything delivered: segment and ack file removed
    assert not acks.exists()
    acks.write_bytes(orphan)  # what the kill left

    spool = Spool(tmp_path)
    assert spool.current.path.with_suffix(".acks") == acks  # the same id again
    for i in range(3):
        spool.append("t", b"k", b"new%d" % i)
    abandon(spool)
    again = Spool(tmp_path)
    assert replayed(again) == [b"new0", b"new1", b"new2"]
    again.close()


def test_a_short_ack_write_is_cut_off_and_written_again(tmp_path):
    """A write of an acknowledgement that only partly fits (here a file-size limit in a child
    process, which makes the kernel write one byte of four, as a full disk does at a block
    boundary) must not shift the entries after it: with the stray byte kept, the next entry
    (record 3) reads as record 768, which was never delivered."""
    import subprocess
    import sys

    child = f"""
import os, resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from producers.spool import Spool
from tracetrain.errors import Backpressure
spool = Spool({str(tmp_path)!r})
for i in range(1000):
    spool.append("t", b"k", b"%04d" % i)
sid = spool.current.id
spool.ack_many([(sid, 0), (sid, 1), (sid, 2)])
size = spool.current.path.with_suffix(".acks").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 1, resource.RLIM_INFINITY))
spool.ack_many([(sid, 256)])
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
spool.ack_many([(sid, 3)])
os._exit(0)  # killed: nothing closed, nothing synced
"""
    subprocess.run([sys.executable, "-c", child], check=True, timeout=60)
    again = Spool(tmp_path)
    delivered = {0, 1, 2, 3, 256}
    assert [int(v) for v in replayed(again)] == [i for i in range(1000) if i not in delivered]
    again.close()


def test_the_spool_refuses_records_past_its_limit_until_deliveries_make_room(tmp_path):
    spool = Spool(tmp_path, segment_bytes=4096, max_bytes=3 * 4096)
    kept = []
    with pytest.raises(Backpressure, match="spool_max_mb") as refused:
        for _ in range(1000):
            kept.append(spool.append("t", b"k", b"x" * 200))
    assert refused.value.retry_after == 5.0 and spool.bytes <= 3 * 4096
    with pytest.raises(Backpressure):
        spool.check_room(200)  # what the gateway asks before calling its upstream
    spool.ack_many(kept)  # delivered: the closed segments go, and so does the current one
    spool.append("t", b"k", b"after")
    spool.check_room(200)
    assert spool.unacked() == 1
    spool.close()


@pytest.mark.faults
def test_a_full_disk_refuses_records_and_keeps_acknowledgements_for_later(tmp_path):
    """On a real full file system (a small tmpfs, filled): a record that does not fit is
    refused (SpoolFull, a Backpressure) and cut off; an acknowledgement that does not fit
    raises nothing, stays in memory and is written once there is room."""
    from testkit.disk import fill, small_filesystem

    with small_filesystem(tmp_path / "disk", size_kb=256) as disk:
        spool = Spool(disk / "spool")
        sid = spool.current.id
        values = [b"%04d" % i for i in range(1100)]
        for value in values:
            spool.append("t", b"k", value)
        # Acknowledge until the ack file ends on a page boundary: the next entry needs a
        # page of its own.
        acks, done = spool.current.path.with_suffix(".acks"), 0
        while done == 0 or acks.stat().st_size % 4096:
            spool.ack_many([(sid, done)])
            done += 1
        filler = fill(disk)
        spool.ack_many([(sid, done)])  # no room: raises nothing
        assert spool.no_room_since is not None
        with pytest.raises(Backpressure, match="disk full"):
            for i in range(1100, 2000):  # until the segment's last page is used up
                spool.append("t", b"k", b"%04d" % i)
                values.append(b"%04d" % i)
        filler.unlink()
        spool.append("t", b"k", b"after")
        spool.sync()  # writes the held-back acknowledgement
        abandon(spool)
        again = Spool(disk / "spool")
        assert replayed(again) == values[done + 1:] + [b"after"]
        again.close()
