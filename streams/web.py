"""The streams worker's pages on the Faust web server: `/metrics` (Prometheus text, for
people and Prometheus), `/state` (the same figures as typed JSON, for code that decides,
e.g. replay's wait and the demo's dashboard) and `/healthz`.

    add_pages(app, metrics)            # in streams/app.py's create_app
    httpx.get(state_url(settings.streams)).json()["output_transitions"]
"""

from __future__ import annotations

from typing import Any

from streams.metrics import StreamsMetrics
from tracetrain.observability import (
    AIOHTTP_CONTENT_TYPE,
    HEALTH_PATH,
    METRICS_PATH,
    STATE_PATH,
    json_safe,
)
from tracetrain.settings.streams import StreamsSettings


def state_url(streams: StreamsSettings) -> str:
    return f"http://{streams.web_host}:{streams.web_port}{STATE_PATH}"


def add_pages(app: Any, metrics: StreamsMetrics) -> None:
    """Serve `metrics` on the Faust `app`'s web server."""

    @app.page(METRICS_PATH)
    async def metrics_page(web, request):
        return web.bytes(metrics.exposition(), content_type=AIOHTTP_CONTENT_TYPE)

    @app.page(STATE_PATH)
    async def state_page(web, request):
        return web.json(json_safe(metrics.state()))

    @app.page(HEALTH_PATH)
    async def health_page(web, request):
        return web.json({"ok": True, "stage": "streams"})
