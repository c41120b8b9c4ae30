"""The spool on its own: records read back in order, a torn tail is cut off, acknowledged
segments disappear, a second process cannot open a locked spool."""

from __future__ import annotations

import pytest

from producers.errors import ProducerError
from producers.spool import Spool


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
    pos, seen = again.pending_from(0, 0), []
    while pos is not None:
        rec = again.read(*pos)
        seen.append(rec.value.decode())
        pos = again.pending_from(pos[0], pos[1] + 1)
    assert seen == [f"v{i}" for i in (2, 3, 4, 6, 7, 8, 9)]
    assert again.unacked() == 7
    again.ack_many([(1, i) for i in (2, 3, 4, 6, 7, 8, 9)])
    assert not path.exists(), "a closed, fully acknowledged segment must be removed"
    again.close()


def test_locked_spool_is_refused(tmp_path):
    first = Spool(tmp_path)
    with pytest.raises(ProducerError, match="locked"):
        Spool(tmp_path)
    first.close()
