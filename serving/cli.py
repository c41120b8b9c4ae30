"""The `tracetrain` subcommands of the serving stage; `register` adds them to the main app.

    tracetrain engine [--backend embedded|vllm] [--port N]
    tracetrain reloader [--max-seconds S]

Their detached forms (`tracetrain up --services engine,reloader`) are declared in
`serving/service.py`.
"""

from __future__ import annotations

import typer


def _settings(**engine_overrides):
    from tracetrain.settings import get_settings

    settings = get_settings()
    updates = {k: v for k, v in engine_overrides.items() if v is not None}
    if updates:
        settings = settings.model_copy(
            update={"engine": settings.engine.model_copy(update=updates)})
    return settings


def _logging() -> None:
    from tracetrain.observability import configure_logging

    configure_logging("INFO")


def engine(
    backend: str = typer.Option(None, help="embedded (CPU, transformers+PEFT) or vllm (GPU)."),
    port: int = typer.Option(None, help="Port to serve on (default settings.engine.port)."),
    max_seconds: float = typer.Option(None, help="Stop after this many seconds (tests)."),
) -> None:
    """Serve the policy with an OpenAI-compatible API that hot-reloads checkpoints."""
    _logging()
    settings = _settings(backend=backend, port=port)
    if settings.engine.backend == "vllm":
        from serving.vllm import run_vllm

        raise typer.Exit(run_vllm(settings))
    from serving.engine.server import serve

    serve(settings, max_seconds=max_seconds)


def reloader(
    max_seconds: float = typer.Option(None, help="Stop after this many seconds (tests)."),
    max_loads: int = typer.Option(None, help="Stop after this many successful loads."),
) -> None:
    """Follow the registered model alias in MLflow and load each new version into the engine."""
    _logging()
    from serving.reloader import Reloader

    reloader = Reloader(_settings())
    with reloader.serve_status():  # /metrics, /healthz, /state on reloader.metrics_port
        reloader.run(max_seconds=max_seconds, max_loads=max_loads)
