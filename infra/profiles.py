"""The stack's profiles: which processes `tracetrain up --profile NAME` runs, each an instance
of a stage's `Service` with its own name (pid file, log) and its own settings overrides.

    dev         today's `up`: one broker, MLflow on SQLite, the `--services` named, one each
    production  the production topology on this machine (no Docker): 3 brokers (replication
                3, min ISR 2), PostgreSQL and MLflow on it, 1 engine, 2 gateways (gateway.port
                and gateway.port + 1, both in front of the engine or the pool), 2 streams
                workers (streams.web_port and + 1, one consumer group), the learner as a
                2-rank torchrun job, the reloader

Several instances of one service differ only in the settings they are started with (a port,
a spool folder): an instance is (name, service, overrides), and the overrides are section
updates, some computed from the settings (`gateway.port + 1`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infra import services
from infra.kafka import broker
from learner.service import learner_job
from producers.service import GATEWAY
from serving.service import ENGINE, RELOADER, engine_url
from streams.service import STREAMS
from tracetrain.errors import InfraError
from tracetrain.settings import Settings

# A value of an override: a constant, or computed from the settings the profile starts with.
Value = Any | Callable[[Settings], Any]


def override(settings: Settings, sections: dict[str, dict[str, Value]]) -> Settings:
    """`settings` with each section's fields replaced (callables called on `settings`)."""
    update = {}
    for section, values in sections.items():
        fields = {k: v(settings) if callable(v) else v for k, v in values.items()}
        update[section] = getattr(settings, section).model_copy(update=fields)
    return settings.model_copy(update=update)


@dataclass(frozen=True)
class Instance:
    """One process of a profile: `service` started as `name` with `overrides`."""

    name: str
    service: services.Service
    overrides: dict[str, dict[str, Value]] = field(default_factory=dict)

    def settings(self, settings: Settings) -> Settings:
        return override(settings, self.overrides)


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    brokers: int
    postgres: bool
    # Settings of the whole profile (every instance's, before its own overrides).
    overrides: dict[str, dict[str, Value]]
    instances: tuple[Instance, ...]

    def settings(self, settings: Settings) -> Settings:
        return override(settings, self.overrides)


def _engine_unless_pool(settings: Settings) -> str:
    """The gateways' engine: the profile's, unless a pool (`gateway.upstream_urls`) is set."""
    if settings.gateway.upstream_urls:
        return settings.gateway.upstream_url
    return f"{engine_url(settings)}/v1"


def _gateway(n: int) -> Instance:
    return Instance(f"gateway-{n}", GATEWAY, {"gateway": {
        "port": lambda s: s.gateway.port + n - 1, "spool_name": f"gateway-{n}",
        "upstream_url": _engine_unless_pool}})


def _streams(n: int) -> Instance:
    return Instance(f"streams-{n}", STREAMS,
                    {"streams": {"web_port": lambda s: s.streams.web_port + n - 1}})


DEV = Profile(
    "dev", "one broker, MLflow on SQLite, the --services named (kafka,mlflow by default)",
    brokers=1, postgres=False, overrides={}, instances=())

PRODUCTION = Profile(
    "production", "3 brokers (replication 3, min ISR 2), PostgreSQL + MLflow, 1 engine, "
    "2 gateways (gateway.port, +1), 2 streams workers (streams.web_port, +1), the learner as "
    "2 torchrun ranks, the reloader",
    brokers=3, postgres=True,
    overrides={
        "kafka": {"brokers": 3, "bootstrap_servers": lambda s: broker.bootstrap(s.kafka, 3)},
        "topics": {"replication": 3, "min_insync_replicas": 2},
        "mlflow": {"backend_store_uri": lambda s: s.mlflow.backend_store_uri or
                   s.postgres.store_uri},
    },
    instances=(Instance("engine", ENGINE), _gateway(1), _gateway(2), _streams(1), _streams(2),
               Instance("learner", learner_job(2)), Instance("reloader", RELOADER)),
)

PROFILES = {p.name: p for p in (DEV, PRODUCTION)}


def get(name: str) -> Profile:
    if name not in PROFILES:
        raise InfraError(f"unknown profile {name!r}; expected one of {', '.join(PROFILES)}")
    return PROFILES[name]


def help_text() -> str:
    return "; ".join(f"{p.name}: {p.summary}" for p in PROFILES.values())
