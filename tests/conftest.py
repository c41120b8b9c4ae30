"""Shared fixtures: one real Kafka broker per test session, per-test topic prefixes.

The broker is the real Apache Kafka 4 from `infra/kafka/lib`, on free loopback ports, with
its state in a temporary TRACETRAIN_HOME. Each test that needs topics gets its own prefix, so
tests never read each other's data. Stage-specific fixtures live in `tests/STAGE/conftest.py`.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from infra import processes, topics
from infra.kafka import broker
from tracetrain.settings import Settings, load_settings
from tracetrain.settings.infra import KafkaSettings, TopicSettings


@pytest.fixture(scope="session")
def tt_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("tracetrain-home")
    return home


@pytest.fixture(scope="session")
def kafka_broker(tt_home) -> KafkaSettings:
    """A real single KRaft broker for the whole session; stopped at the end."""
    kafka = KafkaSettings(
        port=processes.free_port(), controller_port=processes.free_port(), heap_mb=512
    )
    broker.start(tt_home / "session-kafka", kafka, brokers=1)
    kafka = kafka.model_copy(update={"bootstrap_servers": broker.bootstrap(kafka, 1)})
    yield kafka
    broker.stop(tt_home / "session-kafka")


def settings_with(base: Settings | None = None, **sections) -> Settings:
    """A Settings object with some sections replaced: settings_with(kafka=k, topics=t)."""
    base = base or load_settings()
    return base.model_copy(update=sections)


@pytest.fixture
def topic_settings(request) -> TopicSettings:
    """A fresh topic prefix for this test (topics not yet created)."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return TopicSettings(prefix=f"t-{name}-{uuid.uuid4().hex[:8]}", partitions=4)


@pytest.fixture
def kafka_settings(kafka_broker, topic_settings, tt_home) -> Settings:
    """Settings pointing at the session broker, with this test's own topics created."""
    topics.create_topics(kafka_broker.bootstrap_servers, topic_settings)
    return settings_with(kafka=kafka_broker, topics=topic_settings, home=tt_home)


@pytest.fixture(autouse=True, scope="session")
def _no_user_config():
    """Tests must not pick up a developer's tracetrain.toml or TRACETRAIN_* variables."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("TRACETRAIN_")}
    for key in saved:
        del os.environ[key]
    os.environ["TRACETRAIN_CONFIG"] = "/nonexistent/tracetrain.toml"
    yield
    os.environ.pop("TRACETRAIN_CONFIG", None)
    os.environ.update(saved)


REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    """The default model as safetensors, converted once into the repo's (git-ignored)
    `.tracetrain/` so that later test sessions and `make demo` reuse it."""
    from tracetrain.base_model import DEFAULT_MODEL, resolve_base_model

    return resolve_base_model(DEFAULT_MODEL, REPO / ".tracetrain")


@pytest.fixture(scope="session")
def mlflow_server(tt_home):
    """A real `mlflow server` (SQLite, local artifacts) on a free port for the session."""
    from infra import mlflow_server as server
    from tracetrain.settings.infra import MlflowSettings

    mlflow = MlflowSettings(port=processes.free_port())
    home = tt_home / "session-mlflow"
    server.start(home, mlflow)
    yield mlflow
    server.stop(home)
