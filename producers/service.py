"""The producers stage's process, declared once: the OpenAI-compatible gateway.

    tracetrain up --services kafka,gateway
"""

from __future__ import annotations

from infra.services import Service, cli

GATEWAY = Service(
    name="gateway",
    summary="OpenAI-compatible proxy in front of the engine; records every call as a Span",
    reads=("agents' OpenAI calls", "rewards and OTLP traces over HTTP"),
    writes=("spans", "rewards"),
    argv=lambda s: cli("gateway"),
    listen=lambda s: (s.gateway.host, s.gateway.port),
    health_path="/healthz",
    start_timeout_s=lambda s: s.gateway.start_timeout_s,
    port_setting="gateway.port",
)
