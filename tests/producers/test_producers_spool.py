"""The spool on its own: records read back in order, a torn tail is cut off, acknowledged
segments disappear, a second process cannot open a locked spool."""

from __future__ import annotations

import pytest

from producers.errors import ProducerError
from producers.spool import Spool


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
