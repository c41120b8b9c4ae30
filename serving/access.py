"""Who may load what into the embedded engine: the load key and the download folder, shared by
the engine (which checks both) and the reloader (which sends the key and downloads there).

A load makes the engine convert and serve whatever folder it is given, so the load endpoints
are never open: without `engine.load_key` the key is a random one kept in the state folder,
created by whichever of the two starts first, and only a process with the same home reads it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from serving.errors import ServingError
from tracetrain.settings import Settings


def download_dir(settings: Settings) -> Path:
    """Where the reloader downloads versions; the engine loads only from under it."""
    folder = settings.reloader.download_dir or settings.home_dir / "reloader" / "versions"
    return Path(folder).resolve()


def key_file(settings: Settings) -> Path:
    return settings.home_dir / "engine" / "load_key"


def load_key(settings: Settings) -> str:
    """engine.load_key, or the home's key file (made now, mode 0600, if it does not exist)."""
    if settings.engine.load_key is not None:
        return settings.engine.load_key.get_secret_value()
    path = key_file(settings)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole beside it, then linked into place: whoever links first wins, and no
        # reader ever sees an empty file.
        fresh = path.with_name(f".load_key.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
        try:
            os.link(fresh, path)
        except FileExistsError:
            pass
        finally:
            fresh.unlink()
    key = path.read_text().strip()
    if not key:
        raise ServingError(f"{path} is empty; remove it (a new key is made) or set "
                           "engine.load_key")
    return key
