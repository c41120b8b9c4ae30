"""An HTTP proxy in front of a real server that cuts chosen responses half-way through their
body, as a server that stops mid-transfer does: the status and the full Content-Length go out,
then half the bytes, then the connection closes. Everything else passes through unchanged.

    with CuttingProxy("http://127.0.0.1:5000", port, cut=lambda path: path.endswith(".bin"),
                      cuts=1) as proxy:
        ...  # point the client at proxy.url; proxy.cut_paths lists what was cut
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from testkit.fixed_upstream import ServerThread

# Hop-by-hop or recomputed: never forwarded as they came.
_DROPPED = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class CuttingProxy:
    def __init__(self, upstream: str, port: int, cut: Callable[[str], bool], cuts: int = 1):
        self.upstream, self.cut, self.cuts_left = upstream.rstrip("/"), cut, cuts
        self.cut_paths: list[str] = []
        self.server = ServerThread(self, port)
        self.port, self.url = port, self.server.url

    async def __call__(self, scope, receive, send) -> None:  # the ASGI app
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"]
                   if k.decode().lower() not in _DROPPED]
        url = self.upstream + scope["raw_path"].decode()
        if scope["query_string"]:
            url += "?" + scope["query_string"].decode()
        async with httpx.AsyncClient(timeout=60) as client:
            reply = await client.request(scope["method"], url, headers=headers, content=body)
        out = [(k.encode(), v.encode()) for k, v in reply.headers.items()
               if k.lower() not in _DROPPED and k.lower() != "content-encoding"]
        out.append((b"content-length", str(len(reply.content)).encode()))
        await send({"type": "http.response.start", "status": reply.status_code, "headers": out})
        if self.cuts_left > 0 and reply.status_code == 200 and self.cut(scope["path"]):
            self.cuts_left -= 1
            self.cut_paths.append(scope["path"])
            await send({"type": "http.response.body", "more_body": True,
                        "body": reply.content[: len(reply.content) // 2]})
            raise ConnectionAbortedError(f"cut {scope['path']} half-way (a test's fault)")
        await send({"type": "http.response.body", "body": reply.content})

    def __enter__(self) -> CuttingProxy:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()
