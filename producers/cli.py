"""`tracetrain gateway`: the OpenAI-compatible gateway in the foreground.

    tracetrain gateway --help

Its detached form (`tracetrain up --services kafka,gateway`) is declared in
`producers/service.py`.
"""

from __future__ import annotations

import typer

from tracetrain.settings import get_settings

_OPTIONS = {"host": "--host", "port": "--port", "upstream_url": "--upstream",
            "upstream_urls": "--upstream"}


def gateway(
    host: str = typer.Option(None, help="Listen address (default TRACETRAIN_GATEWAY__HOST)."),
    port: int = typer.Option(None, help="Listen port (default TRACETRAIN_GATEWAY__PORT)."),
    upstream: list[str] = typer.Option(
        None, help="OpenAI-compatible engine URL ending in /v1; once per engine of a pool "
                   "(default TRACETRAIN_GATEWAY__UPSTREAM_URLS, or __UPSTREAM_URL)."),
) -> None:
    """Serve the OpenAI-compatible gateway: forwards calls to its engines, records each as a
    Span on Kafka; also POST /v1/rewards, POST /v1/traces (OTLP/HTTP), /metrics."""
    from pydantic import ValidationError

    from producers.gateway.server import serve
    from tracetrain.errors import ConfigError
    from tracetrain.settings.producers import GatewaySettings

    settings = get_settings()
    changes = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if upstream:
        changes.update(upstream_url=upstream[0], upstream_urls=upstream)
    if changes:
        try:  # validated as the settings are: a bad URL is named
            gateway = GatewaySettings.model_validate({**dict(settings.gateway), **changes})
        except ValidationError as exc:
            # --upstream fills upstream_url and upstream_urls: one bad URL, said once
            said = dict.fromkeys(f"{_OPTIONS.get(e['loc'][0] if e['loc'] else '', 'gateway')}: "
                                 f"{e['msg']}" for e in exc.errors())
            raise ConfigError(list(said)) from exc
        settings = settings.model_copy(update={"gateway": gateway})
    serve(settings)
