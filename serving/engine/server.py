"""Run the embedded engine in the foreground.

    tracetrain engine                      # or: python -m serving.engine

Reads settings.engine (host, port, batching), settings.base_model; serves until stopped (or for
`max_seconds`, so tests and benchmarks drive the real server loop).
"""

from __future__ import annotations

import logging
import os
import threading
import time

import uvicorn

from serving.access import download_dir, key_file, load_key
from serving.engine.app import build_app
from serving.engine.policy import Policy
from tracetrain.base_model import resolve_base_model
from tracetrain.settings import Settings

log = logging.getLogger("tracetrain.engine")


def make_server(settings: Settings) -> uvicorn.Server:
    model_dir = resolve_base_model(settings.base_model, settings.home_dir)
    started = time.monotonic()
    policy = Policy(model_dir, settings.engine, settings.home_dir / "engine" / str(os.getpid()))
    source = "engine.load_key" if settings.engine.load_key else f"in {key_file(settings)}"
    app = build_app(policy, settings.engine, base_name=settings.base_model,
                    load_key=load_key(settings), key_source=source,
                    downloads=download_dir(settings))
    log.info("llama-server on %s (%s weights, %d slots) ready in %.1fs (context %d)",
             policy.base.name, settings.engine.weights, settings.engine.slots,
             time.monotonic() - started, policy.context_length)
    config = uvicorn.Config(app, host=settings.engine.host, port=settings.engine.port,
                            log_level="warning", access_log=False)
    return uvicorn.Server(config)


def serve(settings: Settings, max_seconds: float | None = None) -> None:
    server = make_server(settings)
    if max_seconds is not None:
        timer = threading.Timer(max_seconds, lambda: setattr(server, "should_exit", True))
        timer.daemon = True
        timer.start()
    log.info("engine on http://%s:%d/v1", settings.engine.host, settings.engine.port)
    server.run()
