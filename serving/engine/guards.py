"""What the engine refuses before any work: more generations than it has room for (429), loads
without the key (401) or from outside the reloader's download folder (403), and the rest of a
generation whose client has gone (its llama-server request is cancelled, so its slot frees).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse

from serving.errors import ServingError

T = TypeVar("T")
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
# A refused caller retries after this many seconds; a short generation frees its slot in
# about that time, and clients with back-off (openai's) stretch it themselves.
RETRY_AFTER_S = 1


class Refused(ServingError):
    """A request the engine will not serve; `status` and `headers` are its answer's."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


class ClientGone(ServingError):
    """The client disconnected before its answer was ready; the generation was cancelled."""


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": status}}, status_code=status, headers=headers)


class Gate:
    """How many generation requests are inside the engine (tokenizing, waiting for a slot of
    llama-server or generating) and how many may be."""

    def __init__(self, limit: int):
        self.limit, self.admitted, self.refused = limit, 0, 0


class Admission:
    """ASGI wrapper: a generation request past the gate's limit is answered 429 with
    Retry-After before its body is read; the count covers the whole answer, streams included,
    so it drops only when the last byte is sent or the client is gone."""

    def __init__(self, app, gate: Gate):
        self.app, self.gate = app, gate

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") not in GENERATION_PATHS:
            return await self.app(scope, receive, send)
        gate = self.gate
        if gate.admitted >= gate.limit:
            gate.refused += 1
            response = error_response(
                429, f"the engine has {gate.admitted} requests in hand, its limit (engine.slots "
                     f"x engine.max_requests_per_slot = {gate.limit}); retry after "
                     f"{RETRY_AFTER_S}s", "rate_limit_error",
                {"Retry-After": str(RETRY_AFTER_S)})
            return await response(scope, receive, send)
        gate.admitted += 1
        try:
            await self.app(scope, receive, send)
        finally:
            gate.admitted -= 1


def check_key(request: Request, key: str, where: str) -> None:
    """401 unless the request carries `Authorization: Bearer <key>`."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             key.encode()):
        raise Refused(401, f"{request.url.path} needs `Authorization: Bearer <key>` with the "
                           f"engine's load key ({where})", {"WWW-Authenticate": "Bearer"})


def loadable(path: str, folder: Path, field: str) -> str:
    """`path` resolved (links followed), if it lies under `folder`; else 403 naming both."""
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(folder):
        raise Refused(403, f"{field} {path!r} is outside the reloader's download folder "
                           f"{str(folder)!r} (reloader.download_dir); the engine loads only "
                           "from there")
    return str(resolved)


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientGone once the client disconnects first (then `work` is
    cancelled: its call to llama-server is closed, which cancels the generation there)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)  # its slot is released before we answer
    raise ClientGone(f"the client of {request.url.path} disconnected; its generation was "
                     "cancelled")


async def _disconnect(request: Request) -> None:
    # The body is read by now: the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
