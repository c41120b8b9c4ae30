"""Start a streams worker as a detached process (`python -m streams`), for
`tracetrain up --services streams`, the tests and the benchmark.

The child builds its own Settings from the environment (`tracetrain.settings.settings_env`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from infra import processes
from tracetrain.settings import Settings, settings_env


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
