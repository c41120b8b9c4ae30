"""Run the gateway in the foreground (`tracetrain gateway`); `producers/service.py` declares
its detached form (`tracetrain up --services kafka,gateway`)."""

from __future__ import annotations

import uvicorn

from producers.gateway.app import create_app
from tracetrain.settings import Settings


def serve(settings: Settings) -> None:
    gw = settings.gateway
    uvicorn.run(create_app(settings), host=gw.host, port=gw.port, log_level="warning",
                access_log=False)
