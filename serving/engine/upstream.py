"""The llama-server behind the engine, and the blue/green swap that changes it without a gap.

llama-server loads LoRA adapters only at start, so a new version is a new server: it starts
beside the serving one on the base GGUF plus the version's adapter (or on a full checkpoint's
GGUF), and once healthy it takes all new requests. The old server drains: requests already
sent to it finish there and carry its policy_version; then it stops. A conversion or start
that fails leaves the old server serving and raises LoadError. Swaps run one at a time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from serving.engine.generation import GenRequest, GenResult, completion_body
from serving.errors import LoadError, ServingError
from serving.llamacpp.server import LlamaServer, LlamaServerError

log = logging.getLogger("tracetrain.engine")

# Seconds an idle connection to llama-server is kept for reuse: below the 5 s after which
# cpp-httplib closes it (CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND).
KEEPALIVE_S = 2.0


class UpstreamError(ServingError):
    """llama-server failed a request (it answered an error or died mid-way)."""


@dataclass
class Upstream:
    """One running llama-server and the version it serves."""

    server: LlamaServer
    policy_version: int
    name: str
    path: str | None  # the adapter or checkpoint folder it serves; None: the base model
    files: list[Path] = field(default_factory=list)  # converted GGUFs, removed when it stops
    in_flight: int = 0


class Upstreams:
    """The serving upstream, the retiring ones, and the requests between them."""

    def __init__(self, first: Upstream, drain_timeout_s: float = 300.0):
        self.current = first
        self.retiring: list[Upstream] = []
        self.drain_timeout_s = drain_timeout_s
        self.most_in_flight = 0
        self.requests = 0
        self.resent = 0  # requests sent again after a connection closed without an answer
        self._swap_lock = asyncio.Lock()
        # Each slot of llama-server takes one connection; keep enough open for all of them.
        # With httpx's default expiry (5 s, as llama-server's), a request sent on a connection
        # idle for 4.99 s could meet the server's close and get no answer (see _open).
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0),
                                       limits=httpx.Limits(max_connections=256,
                                                           keepalive_expiry=KEEPALIVE_S))

    # ---- requests ---------------------------------------------------------------------------
    def _take(self, upstream: Upstream | None = None) -> Upstream:
        upstream = upstream or self.current
        upstream.in_flight += 1
        self.requests += 1
        self.most_in_flight = max(self.most_in_flight, upstream.in_flight)
        return upstream

    async def generate(self, req: GenRequest, on: Upstream | None = None) -> GenResult:
        """One generation on `on` (the choices of one call share it: one policy_version),
        or on the current upstream."""
        upstream = self._take(on)
        try:
            async with self._open(upstream, completion_body(req)) as response:
                await response.aread()
            body = _checked(response, upstream)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"llama-server (policy_version {upstream.policy_version}) "
                                f"failed: {type(exc).__name__}: {exc}") from exc
        finally:
            upstream.in_flight -= 1
        result = GenResult(policy_version=upstream.policy_version)
        result.add(body, req.top_logprobs)
        return result

    async def generate_all(self, reqs: list[GenRequest]) -> list[GenResult]:
        """The choices of one call, generated side by side on one upstream."""
        on = self.current
        return list(await asyncio.gather(*(self.generate(req, on) for req in reqs)))

    async def stream(self, req: GenRequest, on: Upstream | None = None
                     ) -> AsyncIterator[tuple[str, list[int], GenResult]]:
        """Yields (new text, new token ids, the result so far) per chunk; the last chunk's
        result is complete (finish_reason set)."""
        upstream = self._take(on)
        result = GenResult(policy_version=upstream.policy_version)
        try:
            async with self._open(upstream, completion_body(req, stream=True)) as response:
                if response.status_code != 200:
                    await response.aread()
                    _checked(response, upstream)
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    chunk = json.loads(line[len("data: "):])
                    if "error" in chunk:
                        raise UpstreamError(f"llama-server: {chunk['error']}")
                    result.add(chunk, req.top_logprobs)
                    yield chunk.get("content") or "", chunk.get("tokens") or [], result
        except httpx.HTTPError as exc:
            raise UpstreamError(f"llama-server (policy_version {upstream.policy_version}) "
                                f"failed mid-stream: {type(exc).__name__}: {exc}") from exc
        finally:
            upstream.in_flight -= 1

    @asynccontextmanager
    async def _open(self, upstream: Upstream, body: dict) -> AsyncIterator[httpx.Response]:
        """POST /completion, entered once the answer's headers are in (the body is read inside,
        and closed on leaving); sent once more when llama-server closed the connection without
        answering. A connection it closed as idle just as the request went out (its keep-alive
        ends as the pool reuses it; see KEEPALIVE_S) fails that way though the server is well,
        and since nothing came back, nothing was generated for the caller yet."""
        request = self._http.build_request("POST", f"{upstream.server.url}/completion",
                                           json=body)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.RemoteProtocolError as exc:
            log.warning("llama-server (policy_version %d) closed a connection without "
                        "answering (%s); sending the request again", upstream.policy_version, exc)
            self.resent += 1
            response = await self._http.send(request, stream=True)
        try:
            yield response
        finally:
            await response.aclose()

    async def stream_all(self, reqs: list[GenRequest]
                         ) -> AsyncIterator[tuple[int, str | None, list[int], GenResult]]:
        """The choices of one call streamed side by side on one upstream, chunks interleaved as
        they come: (choice index, new text, new token ids, its result so far), and once a
        choice has ended (index, None, [], its complete result)."""
        on = self.current
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, req: GenRequest) -> None:
            result = GenResult(policy_version=on.policy_version)
            try:
                async for text, ids, result in self.stream(req, on):
                    await queue.put((index, text, ids, result))
                await queue.put((index, None, [], result))
            except Exception as exc:  # noqa: BLE001 - handed to the reader, raised there
                await queue.put(exc)

        tasks = [asyncio.create_task(pump(i, req)) for i, req in enumerate(reqs)]
        try:
            open_choices = len(reqs)
            while open_choices:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                open_choices -= item[1] is None
                yield item
        finally:
            for task in tasks:
                task.cancel()

    # ---- swaps ------------------------------------------------------------------------------
    async def swap(self, make: callable) -> Upstream:
        """Start the upstream `make()` builds (in a thread: conversion and start block), make
        it current, and retire the old one. `make` raises LoadError when the files are bad."""
        async with self._swap_lock:
            started = time.monotonic()
            try:
                new = await asyncio.to_thread(make)
            except LlamaServerError as exc:
                raise LoadError(f"the new llama-server did not start: {exc}") from exc
            old, self.current = self.current, new
            log.info("serving policy_version %d (%s) after %.2fs; policy_version %d drains",
                     new.policy_version, new.name, time.monotonic() - started,
                     old.policy_version)
            self.retiring.append(old)
            asyncio.get_running_loop().create_task(self._retire(old))
            return new

    async def _retire(self, old: Upstream) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while old.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if old.in_flight:
            log.warning("policy_version %d still had %d requests after %.0fs; stopping it",
                        old.policy_version, old.in_flight, self.drain_timeout_s)
        await asyncio.to_thread(old.server.stop)
        for path in old.files:
            path.unlink(missing_ok=True)
        self.retiring.remove(old)

    async def close(self) -> None:
        await self._http.aclose()
        for upstream in [self.current, *self.retiring]:
            await asyncio.to_thread(upstream.server.stop)


def _checked(response: httpx.Response, upstream: Upstream) -> dict:
    if response.status_code != 200:
        raise UpstreamError(f"llama-server (policy_version {upstream.policy_version}) answered "
                            f"{response.status_code}: {response.text[:300]}")
    return response.json()
