"""Settings of the local stack: Kafka broker(s), topics, MLflow server, schema registry."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator


class KafkaSettings(BaseModel):
    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Comma-separated host:port list clients connect to."
    )
    brokers: Literal[1, 3] = Field(1, description="Brokers `tracetrain kafka start` runs locally.")
    port: int = Field(9092, ge=1, le=65535, description="Client port of the first local broker.")
    controller_port: int = Field(
        9192, ge=1, le=65535, description="KRaft controller port of the first local broker."
    )
    heap_mb: int = Field(512, ge=128, description="JVM heap of each local broker.")
    start_timeout_s: float = Field(180.0, gt=0)


class TopicSettings(BaseModel):
    prefix: str = Field("tracetrain", description="Lets several pipelines share one cluster.")
    partitions: int = Field(4, ge=1, description="Partitions of spans, rewards, air, transitions.")
    # Per-topic overrides exist so that a mismatch can be configured, and then caught: spans,
    # rewards and air must be co-partitioned for the rollout join.
    spans_partitions: int | None = Field(None, ge=1)
    rewards_partitions: int | None = Field(None, ge=1)
    air_partitions: int | None = Field(None, ge=1)
    replication: int = Field(1, ge=1)
    min_insync_replicas: int = Field(1, ge=1)
    retention_ms: int = Field(7 * 24 * 3600 * 1000, ge=-1, description="-1 keeps forever.")

    @field_validator("prefix")
    @classmethod
    def _prefix_is_topic_safe(cls, value: str) -> str:
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        if not value or set(value) - allowed:
            raise ValueError(f"{value!r} must be non-empty and use only [a-zA-Z0-9._-]")
        return value

    def name(self, short: str) -> str:
        return f"{self.prefix}.{short}"

    @property
    def spans(self) -> str:
        return self.name("spans")

    @property
    def rewards(self) -> str:
        return self.name("rewards")

    @property
    def air(self) -> str:
        return self.name("air")

    @property
    def transitions(self) -> str:
        return self.name("transitions")

    @property
    def checkpoints(self) -> str:
        return self.name("checkpoints")

    @property
    def dlq(self) -> str:
        return self.name("dlq")


class MlflowSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(5000, ge=1, le=65535)
    tracking_uri: str | None = Field(
        None, description="An existing MLflow server; unset means the local one `up` starts."
    )
    backend_store_uri: str | None = Field(
        None, description="Where the local server keeps runs and the registry (postgresql://...); "
        "unset: SQLite under the state folder, or the local PostgreSQL when `up` starts one."
    )
    experiment: str = "tracetrain"
    registered_model: str = "tracetrain-policy"
    # mlflow server imports a lot: ~20 s idle, minutes on a loaded 2-core machine.
    start_timeout_s: float = Field(300.0, gt=0)

    @property
    def uri(self) -> str:
        return self.tracking_uri or f"http://{self.host}:{self.port}"


class PostgresSettings(BaseModel):
    """The local PostgreSQL server (Debian's `postgresql` package) that `up --profile
    production` runs MLflow on."""

    host: str = "127.0.0.1"
    port: int = Field(5432, ge=1, le=65535)
    user: str = Field("tracetrain", description="Superuser initdb creates (trust on loopback).")
    database: str = Field("mlflow", description="The database MLflow's backend store uses.")
    start_timeout_s: float = Field(60.0, gt=0)

    def uri(self, database: str | None = None) -> str:
        """libpq's URI (psycopg2.connect, psql)."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database or self.database}"

    @property
    def store_uri(self) -> str:
        """MLflow's backend store URI: SQLAlchemy 2.1 takes a bare postgresql:// for psycopg 3,
        so the driver installed (psycopg2-binary) is named."""
        return self.uri().replace("postgresql://", "postgresql+psycopg2://", 1)


class SchemaRegistrySettings(BaseModel):
    url: str | None = Field(
        None, description="Confluent schema registry; set, the Confluent wire format is written."
    )
