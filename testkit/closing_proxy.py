"""A TCP proxy in front of a real server that closes the first `drops` connections once a
request has come in on them, without answering, as a server does that closes an idle
keep-alive connection just as a request is sent on it. Later connections pass through.

    async with ClosingProxy(port_of_the_real_server, drops=1) as proxy:
        ...  # point the client at proxy.url; proxy.dropped counts the closed connections
"""

from __future__ import annotations

import asyncio


class ClosingProxy:
    def __init__(self, upstream_port: int, drops: int = 1, host: str = "127.0.0.1"):
        self.upstream_port, self.drops_left, self.host = upstream_port, drops, host
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> ClosingProxy:
        self._server = await asyncio.start_server(self._connection, self.host, 0)
        self.url = f"http://{self.host}:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        if self.drops_left > 0:
            self.drops_left -= 1
            await reader.read(65536)  # the request has come in; no answer follows
            self.dropped += 1
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
