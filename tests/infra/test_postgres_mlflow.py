"""MLflow on a real PostgreSQL server (Debian's package, started from the state folder as
`up --profile production` starts it): runs, model versions and aliases are kept in
PostgreSQL and survive a restart of both servers."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg2
import pytest
from mlflow import MlflowClient

from infra import mlflow_server, postgres, processes
from tracetrain.errors import InfraError
from tracetrain.settings.infra import MlflowSettings, PostgresSettings


def _start(home: Path, pg: PostgresSettings, mlflow: MlflowSettings) -> None:
    postgres.start(home, pg)
    mlflow_server.start(home, mlflow)


def _stop(home: Path) -> None:
    mlflow_server.stop(home)
    assert postgres.stop(home)


@pytest.fixture
def postgres_mlflow(tmp_path):
    pg = PostgresSettings(port=processes.free_port())
    mlflow = MlflowSettings(port=processes.free_port(), backend_store_uri=pg.store_uri)
    home = tmp_path / "home"
    try:  # a server that started before the other failed is stopped too
        _start(home, pg, mlflow)
        yield home, pg, mlflow
    finally:
        mlflow_server.stop(home)
        postgres.stop(home)


def test_runs_and_the_registry_live_in_postgres_across_restarts(postgres_mlflow, tmp_path):
    home, pg, mlflow = postgres_mlflow
    client = MlflowClient(tracking_uri=mlflow.uri, registry_uri=mlflow.uri)
    experiment = client.create_experiment("pg-exp")
    run = client.create_run(experiment)
    client.log_param(run.info.run_id, "lr", "0.001")
    client.create_registered_model("pg-model")
    for _ in range(2):
        client.create_model_version("pg-model", source=f"runs:/{run.info.run_id}/adapter",
                                    run_id=run.info.run_id)
    client.set_registered_model_alias("pg-model", "serving", "2")
    # What MLflow wrote is in PostgreSQL's tables (not a SQLite file of the state folder).
    with psycopg2.connect(pg.uri()) as conn, conn.cursor() as cur:
        cur.execute("SELECT version FROM model_versions WHERE name = 'pg-model' ORDER BY version")
        assert [row[0] for row in cur.fetchall()] == [1, 2]
    assert not (home / "mlflow" / "mlflow.db").exists()

    _stop(home)
    assert not processes.port_in_use(pg.host, pg.port)
    _start(home, pg, mlflow)  # the cluster exists: no initdb, the same data
    assert client.get_model_version_by_alias("pg-model", "serving").version == "2"
    assert client.get_run(run.info.run_id).data.params == {"lr": "0.001"}


def test_a_taken_port_names_the_setting(postgres_mlflow, tmp_path):
    _, pg, _ = postgres_mlflow
    with pytest.raises(InfraError, match=r"PostgreSQL is already taken.*postgres\.port"):
        postgres.start(tmp_path / "other", pg)


def test_a_machine_without_the_package_is_told_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(postgres, "PACKAGE_BINS", tmp_path)
    (tmp_path / "15" / "bin").mkdir(parents=True)  # a version folder without the server
    with pytest.raises(InfraError, match="apt-get install postgresql"):
        postgres.bin_dir()


def test_the_newest_installed_version_is_used(monkeypatch, tmp_path):
    for version in ("9.6", "15", "13"):
        bins = tmp_path / version / "bin"
        bins.mkdir(parents=True)
        for name in ("postgres", "initdb"):
            (bins / name).touch()
    monkeypatch.setattr(postgres, "PACKAGE_BINS", tmp_path)
    assert postgres.bin_dir() == tmp_path / "15" / "bin"
    assert os.path.isdir(postgres.bin_dir())
