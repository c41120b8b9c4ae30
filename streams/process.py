"""Start a streams worker as a detached process (`python -m streams`), for
`tracetrain up --services streams`, the tests and the benchmark.

The child builds its own Settings from the environment: `settings_env` writes every value of
the parent's Settings as `TRACETRAIN_*` variables, so the child sees exactly the same ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import SecretStr

from infra import processes
from tracetrain.settings import ENV_PREFIX, Settings


def _flatten(values: dict, prefix: str, out: dict[str, str]) -> None:
    for name, value in values.items():
        key = f"{prefix}{name.upper()}"
        if isinstance(value, dict) and name not in _MAP_FIELDS:
            _flatten(value, f"{key}__", out)
        elif value is None:
            continue
        elif isinstance(value, (list, dict)):
            out[key] = json.dumps([v.get_secret_value() if isinstance(v, SecretStr) else v
                                   for v in value] if isinstance(value, list) else value)
        elif isinstance(value, SecretStr):
            out[key] = value.get_secret_value()
        elif isinstance(value, Path):
            out[key] = str(value.resolve())
        else:
            out[key] = str(value)


_MAP_FIELDS: set[str] = set()  # dict-valued settings fields (none today) go as JSON


def settings_env(settings: Settings) -> dict[str, str]:
    out: dict[str, str] = {}
    # Only what differs from the defaults: a few values (Literal[1, 3]) do not parse from text.
    _flatten(settings.model_dump(exclude_defaults=True), ENV_PREFIX, out)
    out[f"{ENV_PREFIX}HOME"] = str(settings.home_dir)  # the child's cwd may differ
    out[f"{ENV_PREFIX}CONFIG"] = "/nonexistent/tracetrain.toml"  # the env says everything
    return out


def start_worker(settings: Settings, name: str = "streams", max_seconds: float | None = None,
                 wait: bool = True) -> processes.ProcessRecord:
    """Spawn a worker; with `wait`, return once its web server (/metrics) answers."""
    s = settings.streams
    argv = [sys.executable, "-m", "streams"]
    if max_seconds is not None:
        argv += ["--max-seconds", str(max_seconds)]
    url = f"http://{s.web_host}:{s.web_port}/metrics"
    record = processes.spawn(settings.home_dir, name, argv, address=f"{s.web_host}:{s.web_port}",
                             health_url=url, env=settings_env(settings),
                             cwd=Path(__file__).resolve().parent.parent)
    if wait:
        processes.wait_until(lambda: processes.healthy(record), 90, f"streams worker {name}",
                             log=record.log, alive=lambda: processes.pid_alive(record.pid))
    return record
