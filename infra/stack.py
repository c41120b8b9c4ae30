"""Bring the whole local stack up and down. Stages add their long-running processes to
`SERVICES` (name -> starter) so that `tracetrain up --services ...` and the demo can start them."""

from __future__ import annotations

import shutil
from collections.abc import Callable

from infra import mlflow_server, processes, topics
from infra.kafka import broker
from tracetrain.settings import Settings

Starter = Callable[[Settings], processes.ProcessRecord]
SERVICES: dict[str, Starter] = {}


def register_service(name: str, starter: Starter) -> None:
    SERVICES[name] = starter


def up(settings: Settings, services: list[str], brokers: int | None = None) -> list[processes.ProcessRecord]:
    home = settings.home_dir
    unknown = [s for s in services if s not in ("kafka", "mlflow", *SERVICES)]
    if unknown:
        raise ValueError(f"unknown service(s) {unknown}; expected kafka, mlflow or one of {sorted(SERVICES)}")
    started: list[processes.ProcessRecord] = []
    if "kafka" in services:
        started += broker.start(home, settings.kafka, brokers)
        topics.create_topics(broker.bootstrap(settings.kafka, brokers or settings.kafka.brokers),
                             settings.topics)
    if "mlflow" in services:
        started.append(mlflow_server.start(home, settings.mlflow))
    for name in services:
        if name in SERVICES:
            started.append(SERVICES[name](settings))
    return started


def down(settings: Settings, wipe: bool = False) -> list[str]:
    home = settings.home_dir
    stopped = []
    # Stage processes first (they talk to Kafka and MLflow), then MLflow, then the brokers.
    for record in processes.records(home):
        if not record.name.startswith("kafka-") and record.name != mlflow_server.NAME:
            if processes.stop(home, record.name):
                stopped.append(record.name)
    if mlflow_server.stop(home):
        stopped.append(mlflow_server.NAME)
    stopped += broker.stop(home)
    if wipe:
        shutil.rmtree(home / "kafka", ignore_errors=True)
        shutil.rmtree(home / "mlflow", ignore_errors=True)
    return stopped
