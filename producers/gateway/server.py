"""Run the gateway: in the foreground (`tracetrain gateway`), or detached as a stack service.

    tracetrain gateway [--host H] [--port P] [--upstream URL]
    tracetrain up --services kafka,gateway

The detached form is spawned through infra.processes with its log and pid file under
$TRACETRAIN_HOME and `/healthz` as its health URL.
"""

from __future__ import annotations

import sys

import uvicorn

from infra import processes
from producers.gateway.app import create_app
from tracetrain.settings import Settings, settings_env


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
        env=settings_env(settings))
    processes.wait_until(lambda: processes.healthy(record), 30, "gateway", log=record.log,
                         alive=lambda: processes.pid_alive(record.pid))
    return record
