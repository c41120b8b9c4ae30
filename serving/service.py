"""The serving stage's processes, declared once: the policy engine and the reloader.

    tracetrain up --services engine,reloader

The engine is `tracetrain engine` (embedded, CPU) or `vllm serve` (GPU) by `engine.backend`;
the reloader follows the registry and loads each new version into the engine.
"""

from __future__ import annotations

from infra.services import Service, cli, status_address
from tracetrain.settings import Settings


def engine_url(settings: Settings) -> str:
    """The engine the reloader drives (and the demo's agents call): its own setting, or the
    engine section's address."""
    if settings.reloader.engine_url:
        return settings.reloader.engine_url.rstrip("/")
    return f"http://{settings.engine.host}:{settings.engine.port}"


def engine_urls(settings: Settings) -> list[str]:
    """Every engine the reloader drives: the pool's (`reloader.engine_urls`), or the one."""
    return list(settings.reloader.engine_urls) or [engine_url(settings)]


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
    health_path="/health",
    start_timeout_s=lambda s: s.engine.start_timeout_s,
    env=_engine_env,
    port_setting="engine.port",
)

RELOADER = Service(
    name="reloader",
    summary="follows the registered model's alias in MLflow and loads each version",
    reads=("MLflow registry", "checkpoints"),
    writes=("the engine's adapters",),
    argv=lambda s: cli("reloader"),
    listen=lambda s: status_address(s.reloader.metrics_host, s.reloader.metrics_port),
    health_path="/healthz",
    start_timeout_s=lambda s: 30.0,
    port_setting="reloader.metrics_port",
)
