"""`tracetrain gateway`: the OpenAI-compatible gateway in the foreground.

    tracetrain gateway --help

Its detached form (`tracetrain up --services kafka,gateway`) is declared in
`producers/service.py`.
"""

from __future__ import annotations

import typer

from tracetrain.settings import get_settings


def gateway(
    host: str = typer.Option(None, help="Listen address (default TRACETRAIN_GATEWAY__HOST)."),
    port: int = typer.Option(None, help="Listen port (default TRACETRAIN_GATEWAY__PORT)."),
    upstream: str = typer.Option(
        None, help="OpenAI-compatible engine URL ending in /v1 "
                   "(default TRACETRAIN_GATEWAY__UPSTREAM_URL)."),
) -> None:
    """Serve the OpenAI-compatible gateway: forwards calls upstream, records each as a
    Span on Kafka; also POST /v1/rewards, POST /v1/traces (OTLP/HTTP), /metrics."""
    from producers.gateway.server import serve

    settings = get_settings()
    changes = {k: v for k, v in (("host", host), ("port", port), ("upstream_url", upstream))
               if v is not None}
    if changes:
        settings = settings.model_copy(
            update={"gateway": settings.gateway.model_copy(update=changes)})
    serve(settings)
