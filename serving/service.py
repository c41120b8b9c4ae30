"""The serving stage's processes, declared once: the policy engine and the reloader.

    tracetrain up --services engine,reloader

The engine is `tracetrain engine` (embedded, CPU) or `vllm serve` (GPU) by `engine.backend`;
the reloader follows the registry and loads each new version into the engine.
"""

from __future__ import annotations

from infra.services import Service, cli
from tracetrain.settings import Settings


def engine_url(settings: Settings) -> str:
    """The engine the reloader drives (and the demo's agents call): its own setting, or the
    engine section's address."""
    if settings.reloader.engine_url:
        return settings.reloader.engine_url.rstrip("/")
    return f"http://{settings.engine.host}:{settings.engine.port}"


def _reloader_status(s: Settings) -> tuple[str, int] | None:
    """Where `tracetrain reloader` serves /healthz; None for metrics_port 0 (a free port, for
    tests), which cannot be known before it starts: then it is ready once spawned."""
    return (s.reloader.metrics_host, s.reloader.metrics_port) if s.reloader.metrics_port \
        else None


def _reloader_health(s: Settings) -> str | None:
    bound = _reloader_status(s)
    return f"http://{bound[0]}:{bound[1]}/healthz" if bound else None


def _engine_argv(settings: Settings) -> list[str]:
    if settings.engine.backend == "vllm":
        from serving.vllm import vllm_argv

        return vllm_argv(settings)
    return cli("engine")


def _engine_env(settings: Settings) -> dict[str, str]:
    if settings.engine.backend == "vllm":
        from serving.vllm import vllm_env

        return vllm_env()
    return {}


ENGINE = Service(
    name="engine",
    summary="the policy behind an OpenAI-compatible API; hot-reloads checkpoints",
    reads=("MLflow artifacts (through the reloader)",),
    writes=(),
    argv=_engine_argv,
    listen=lambda s: (s.engine.host, s.engine.port),
    health_url=lambda s: f"http://{s.engine.host}:{s.engine.port}/health",
    start_timeout_s=lambda s: s.engine.start_timeout_s,
    env=_engine_env,
)

RELOADER = Service(
    name="reloader",
    summary="follows the registered model's alias in MLflow and loads each version",
    reads=("MLflow registry", "checkpoints"),
    writes=("the engine's adapters",),
    argv=lambda s: cli("reloader"),
    listen=_reloader_status,
    health_url=_reloader_health,
    start_timeout_s=lambda s: 30.0,
)
