"""The local stack: every service the pipeline runs, listed once, and `up`/`down` over them.

Kafka and MLflow are the platform (started by `infra/kafka/broker.py` and
`infra/mlflow_server.py`); every stage's process is declared in its own `STAGE/service.py`
and started by the one spawner, `infra.services.start`. This module sits above the stages:
it is the one place that knows them all (with the CLI and the demo).
"""

from __future__ import annotations

import shutil

from infra import mlflow_server, postgres, processes, profiles, services, topics
from infra.kafka import broker
from learner.service import LEARNER
from producers.service import GATEWAY
from serving.service import ENGINE, RELOADER
from streams.service import STREAMS
from tracetrain.errors import InfraError
from tracetrain.settings import Settings

PLATFORM = ("kafka", "mlflow")
# In the order data flows; `up` starts them in the order it is given.
SERVICES: dict[str, services.Service] = {
    s.name: s for s in (ENGINE, GATEWAY, STREAMS, LEARNER, RELOADER)}


def check_names(names: list[str]) -> None:
    unknown = [n for n in names if n not in PLATFORM and n not in SERVICES]
    if unknown:
        raise InfraError(f"unknown service(s) {', '.join(map(repr, unknown))}; expected "
                         f"{', '.join(PLATFORM)} or one of {', '.join(SERVICES)}")


def up(settings: Settings, names: list[str], brokers: int | None = None,
       started: list[processes.ProcessRecord] | None = None) -> list[processes.ProcessRecord]:
    """Start `names` (Kafka and its topics first, then MLflow, then the stages in order).

    Each record is appended to `started` as soon as its process runs, so a caller whose `up`
    fails part-way (a port taken, a service that never became healthy) knows what it started
    and can stop exactly that (`stop_started`)."""
    check_names(names)
    home = settings.home_dir
    started = [] if started is None else started
    if "kafka" in names:
        started += broker.start(home, settings.kafka, brokers)
        topics.create_topics(broker.bootstrap(settings.kafka, brokers or settings.kafka.brokers),
                             settings.topics)
    if "mlflow" in names:
        started.append(mlflow_server.start(home, settings.mlflow))
    for name in names:
        if name in SERVICES:
            started.append(services.start(settings, SERVICES[name]))
    return started


def _running(settings: Settings, name: str) -> bool:
    record = processes.read_record(settings.home_dir, name)
    return record is not None and processes.is_ours(record)


def up_profile(settings: Settings, profile: profiles.Profile,
               started: list[processes.ProcessRecord] | None = None
               ) -> list[processes.ProcessRecord]:
    """Start what of `profile` is not running: its brokers (and topics), PostgreSQL and MLflow
    on it, then its instances in order, each with its own overrides. Run again, it starts
    only what died (a broker, a service): what a restart of the stack does. `started` as in
    `up`."""
    home = settings.home_dir
    started = [] if started is None else started
    settings = profile.settings(settings)
    missing = broker.missing(home, profile.brokers)
    if missing:
        started += broker.start(home, settings.kafka, profile.brokers, only=missing)
    topics.create_topics(settings.kafka.bootstrap_servers, settings.topics)
    if profile.postgres and not _running(settings, postgres.NAME):
        started.append(postgres.start(home, settings.postgres))
    if not settings.mlflow.tracking_uri and not _running(settings, mlflow_server.NAME):
        started.append(mlflow_server.start(home, settings.mlflow))
    for instance in profile.instances:
        if not _running(settings, instance.name):
            started.append(services.start(instance.settings(settings), instance.service,
                                          instance=instance.name))
    return started


def stop_started(settings: Settings, started: list[processes.ProcessRecord]) -> list[str]:
    """Stop the processes of `started` (what an `up` of ours started), newest first: the
    stages, then MLflow, then the brokers. Nothing else under the state folder is touched."""
    stopped = []
    for record in reversed(started):
        current = processes.read_record(settings.home_dir, record.name)
        # The pid file must still be the one that `up` wrote (not a later start's).
        if current is not None and current.pid == record.pid and \
                processes.stop(settings.home_dir, record.name, timeout_s=30):
            stopped.append(record.name)
    return stopped


def down(settings: Settings, wipe: bool = False) -> list[str]:
    """Stop every process with a pid file under the state folder (each checked in /proc to
    be the one that was started, before any signal)."""
    home = settings.home_dir
    stopped = []
    # Stage processes first (they talk to Kafka and MLflow), then MLflow, then its database,
    # then the brokers.
    platform = (mlflow_server.NAME, postgres.NAME)
    for record in processes.records(home):
        if not record.name.startswith("kafka-") and record.name not in platform:
            if processes.stop(home, record.name):
                stopped.append(record.name)
    if mlflow_server.stop(home):
        stopped.append(mlflow_server.NAME)
    if postgres.stop(home):
        stopped.append(postgres.NAME)
    stopped += broker.stop(home)
    if wipe:
        shutil.rmtree(home / "kafka", ignore_errors=True)
        shutil.rmtree(home / "mlflow", ignore_errors=True)
        postgres.wipe(home)
    return stopped
