"""Run the gateway: in the foreground (`tracetrain gateway`), or detached as a stack service.

    tracetrain gateway [--host H] [--port P] [--upstream URL]
    tracetrain up --services kafka,gateway

The detached form is spawned through infra.processes with its log and pid file under
$TRACETRAIN_HOME and `/healthz` as its health URL.
"""

from __future__ import annotations

import json
import sys

import uvicorn
from pydantic import SecretStr

from infra import processes
from producers.gateway.app import create_app
from tracetrain.settings import Settings


def serve(settings: Settings) -> None:
    gw = settings.gateway
    uvicorn.run(create_app(settings), host=gw.host, port=gw.port, log_level="warning",
                access_log=False)


def start_detached(settings: Settings) -> processes.ProcessRecord:
    gw = settings.gateway
    processes.require_free(gw.host, gw.port, "the gateway")
    record = processes.spawn(
        settings.home_dir, "gateway", [sys.executable, "-m", "tracetrain.cli", "gateway"],
        address=f"{gw.host}:{gw.port}", health_url=f"http://{gw.host}:{gw.port}/healthz",
        env=_env(settings))
    processes.wait_until(lambda: processes.healthy(record), 30, "gateway", log=record.log,
                         alive=lambda: processes.pid_alive(record.pid))
    return record


def _env(settings: Settings) -> dict[str, str]:
    """The settings the child needs, as TRACETRAIN_* variables (it builds its own Settings)."""
    env = {"TRACETRAIN_HOME": str(settings.home_dir),
           "TRACETRAIN_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers}
    if settings.schema_registry.url:
        env["TRACETRAIN_SCHEMA_REGISTRY__URL"] = settings.schema_registry.url
    for section in ("gateway", "publisher", "topics"):
        for name, value in getattr(settings, section):
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            elif isinstance(value, list):
                value = json.dumps([v.get_secret_value() if isinstance(v, SecretStr) else v
                                    for v in value])
            env[f"TRACETRAIN_{section.upper()}__{name.upper()}"] = str(value)
    return env
