"""Seconds from a version's alias moving in MLflow to the engine serving it (median of 5).

    .venv/bin/python -m bench.reload

Starts a real MLflow server and the real engine (in this process, on free ports), makes five
real PEFT LoRA adapters of the default model, and runs the real reloader (poll 0.5 s). For each
adapter: register a version, move the `production` alias, and time until a chat response
reports the new policy_version. Last line: JSON with `median_s`, `times_s`, and the median of
the reloader's own load time (`median_load_s`: download + load + verify).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from infra import mlflow_server, processes
from serving.engine.server import make_server
from serving.reloader import Reloader
from testkit.serving import make_adapters, register_version
from tracetrain.base_model import resolve_base_model
from tracetrain.settings import load_settings
from tracetrain.settings.infra import MlflowSettings
from tracetrain.settings.serving import EngineSettings, ReloaderSettings


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="bench-reload-"))
    mlflow = MlflowSettings(port=processes.free_port(), start_timeout_s=300,
                            registered_model=f"bench-{uuid.uuid4().hex[:6]}")
    os.environ["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # not needed; slow to start
    mlflow_server.start(home, mlflow)
    defaults = load_settings()
    # The converted model stays in the usual state folder; only the run's state is temporary.
    model_dir = resolve_base_model(defaults.base_model, defaults.home_dir)
    settings = load_settings(
        home=home, base_model=str(model_dir), engine=EngineSettings(port=processes.free_port()),
        mlflow=mlflow, reloader=ReloaderSettings(alias="production", poll_s=0.5))
    server = make_server(settings)
    thread = threading.Thread(target=server.run, daemon=True)
    stop = threading.Event()
    try:
        thread.start()
        url = f"http://{settings.engine.host}:{settings.engine.port}"
        processes.wait_until(lambda: processes.port_in_use("127.0.0.1", settings.engine.port),
                             120, "bench engine")
        adapters = make_adapters(model_dir, home / "adapters", seeds=[11, 12, 13, 14, 15])
        reloader = Reloader(settings)
        loop = threading.Thread(target=reloader.run, kwargs={"stop": stop}, daemon=True)
        loop.start()
        ask = {"model": "policy", "messages": [{"role": "user", "content": "Hi"}],
               "max_tokens": 1, "temperature": 0}
        times = []
        for adapter in adapters:
            version = register_version(mlflow.uri, mlflow.registered_model, adapter)
            moved = time.perf_counter()  # register_version moves the alias as its last call
            while httpx.post(f"{url}/v1/chat/completions", json=ask,
                             timeout=120).json()["policy_version"] != version:
                time.sleep(0.05)
            times.append(time.perf_counter() - moved)
            print(f"version {version}: serving after {times[-1]:.2f}s")
        loads = [load["seconds"] for load in reloader.state.loads]
        print(json.dumps({"median_s": round(statistics.median(times), 3),
                          "times_s": [round(t, 3) for t in times],
                          "median_load_s": round(statistics.median(loads), 3)}))
    finally:
        stop.set()
        server.should_exit = True
        thread.join(timeout=30)
        mlflow_server.stop(home)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
