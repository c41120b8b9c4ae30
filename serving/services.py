"""Start the engine and the reloader as detached stack services (`tracetrain up --services`).

The child process must see the same settings as the caller, which may have built them in code
(tests do): each section travels as one JSON environment variable (`TRACETRAIN_ENGINE={...}`),
which pydantic-settings reads back into the same typed section.
"""

from __future__ import annotations

import json
import sys

from infra import processes
from tracetrain.settings import Settings

ENGINE, RELOADER = "engine", "reloader"
SECTIONS = ("engine", "reloader", "mlflow", "kafka", "topics")


def child_env(settings: Settings) -> dict[str, str]:
    env = {"TRACETRAIN_HOME": str(settings.home_dir),
           "TRACETRAIN_BASE_MODEL": settings.base_model}
    for section in SECTIONS:
        env[f"TRACETRAIN_{section.upper()}"] = json.dumps(
            getattr(settings, section).model_dump(mode="json"))
    return env


def engine_url(settings: Settings) -> str:
    if settings.reloader.engine_url:
        return settings.reloader.engine_url.rstrip("/")
    return f"http://{settings.engine.host}:{settings.engine.port}"


def start_engine(settings: Settings, wait: bool = True, name: str = ENGINE) -> processes.ProcessRecord:
    """Spawn the engine of settings.engine; `name` keys its pid file (one per engine)."""
    engine = settings.engine
    processes.require_free(engine.host, engine.port, "the engine")
    if engine.backend == "vllm":
        from serving.vllm import vllm_argv, vllm_env

        argv, env = vllm_argv(settings), {**child_env(settings), **vllm_env()}
        health = f"{engine_url(settings)}/health"
    else:
        argv = [sys.executable, "-m", "serving.engine"]
        env, health = child_env(settings), f"{engine_url(settings)}/health"
    record = processes.spawn(settings.home_dir, name, argv, address=f"{engine.host}:{engine.port}",
                             health_url=health, env=env)
    if wait:
        processes.wait_until(lambda: processes.healthy(record), engine.start_timeout_s,
                             "the engine", log=record.log,
                             alive=lambda: processes.pid_alive(record.pid))
    return record


def start_reloader(settings: Settings) -> processes.ProcessRecord:
    argv = [sys.executable, "-m", "tracetrain.cli", "reloader"]
    return processes.spawn(settings.home_dir, RELOADER, argv, address="-", env=child_env(settings))
