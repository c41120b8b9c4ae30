"""The local MLflow tracking server and model registry: `mlflow server` with artifacts served
from the state folder (`$TRACETRAIN_HOME/mlflow/`) and its runs and registry in
`mlflow.backend_store_uri` (PostgreSQL in the production profile, infra/postgres.py), or
SQLite under the state folder when that is unset."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx

from infra import processes
from tracetrain.errors import InfraError
from tracetrain.settings.infra import MlflowSettings

NAME = "mlflow"


def _mlflow_bin() -> str:
    beside = Path(sys.executable).with_name("mlflow")
    found = str(beside) if beside.is_file() else shutil.which("mlflow")
    if not found:
        raise InfraError("the `mlflow` command is missing; run `make setup`")
    return found


def health_url(mlflow: MlflowSettings) -> str:
    return f"http://{mlflow.host}:{mlflow.port}/health"


def is_healthy(mlflow: MlflowSettings) -> bool:
    try:
        return httpx.get(health_url(mlflow), timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def start(home: Path, mlflow: MlflowSettings) -> processes.ProcessRecord:
    if mlflow.tracking_uri:
        raise InfraError(f"TRACETRAIN_MLFLOW__TRACKING_URI is set ({mlflow.tracking_uri}): "
                         "an external server is used, none is started here")
    processes.require_free(mlflow.host, mlflow.port, "the MLflow server", "mlflow.port")
    root = (Path(home) / "mlflow").resolve()
    (root / "artifacts").mkdir(parents=True, exist_ok=True)
    argv = [
        _mlflow_bin(), "server",
        "--host", mlflow.host, "--port", str(mlflow.port),
        "--backend-store-uri", mlflow.backend_store_uri or f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination", str(root / "artifacts"),
        "--serve-artifacts",
        "--workers", "1",
    ]
    # MLflow 3's job runner starts eight more Python processes (huey consumers) that importing
    # mlflow on a small machine makes start-up take minutes; the registry does not need them.
    record = processes.spawn(home, NAME, argv, address=f"{mlflow.host}:{mlflow.port}",
                             health_url=health_url(mlflow),
                             env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        processes.wait_until(lambda: is_healthy(mlflow), mlflow.start_timeout_s, "MLflow server",
                             log=record.log, alive=lambda: processes.pid_alive(record.pid))
    except BaseException:
        # A server that missed its start-up bound, or whose caller was stopped meanwhile
        # (Ctrl-C, SIGTERM), must not linger.
        processes.stop(home, NAME)
        raise
    return record


def stop(home: Path) -> bool:
    return processes.stop(home, NAME)
