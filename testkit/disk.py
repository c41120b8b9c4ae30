"""A small real file system for disk-full tests: a tmpfs mounted for the test, then filled.

    with small_filesystem(tmp_path / "disk", size_kb=512) as disk:
        filler = fill(disk)         # no byte left: writes fail (ENOSPC) or come back short
        filler.unlink()             # room again

Mounting needs root (or CAP_SYS_ADMIN); without it the test is skipped, with the reason. A
tmpfs allocates whole pages: a write that fits in a file's last, partly used page still
succeeds on a full one, and one that crosses into a new page comes back short.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_filesystem(path: Path, size_kb: int) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs",
                              str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {path} ({mounted.stderr.strip()}): needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def fill(folder: Path) -> Path:
    """Fill the file system of `folder` to its last byte; returns the filler (unlink it for room)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    try:
        for chunk in (b"\0" * 65536, b"\0"):
            try:
                while os.write(fd, chunk):
                    pass
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler
