"""Settings of the producers: the Kafka publisher and its spool, the gateway, the tracer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr


class PublisherSettings(BaseModel):
    compression: Literal["lz4", "zstd", "snappy", "gzip", "none"] = "lz4"
    linger_ms: int = Field(5, ge=0)
    batch_size: int = Field(256 * 1024, ge=1)
    queue_max_messages: int = Field(100_000, ge=1)
    max_block_ms: int = Field(50, ge=0, description="Longest a publish call may block the agent.")
    fsync_interval_ms: int = Field(
        1000, ge=1, description="Spool fsync interval: a record still unacknowledged one interval "
        "after it was written is fsynced (power loss; kill -9 safety needs no fsync). Shorter "
        "intervals fsync whenever a busy broker lags that long, and cost throughput."
    )
    spool_segment_mb: int = Field(64, ge=1, description="Size at which a spool segment rolls.")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Prometheus port for tracer/exporter processes."
    )


class GatewaySettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    upstream_url: str = Field("http://127.0.0.1:8100/v1", description="OpenAI-compatible engine.")
    api_keys: list[SecretStr] = Field(default_factory=list, description="Empty: no auth.")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Larger requests get 413.")
    upstream_api_key: SecretStr | None = Field(None, description="Bearer key sent upstream.")
    upstream_timeout_s: float = Field(300.0, gt=0)
    request_token_ids: bool = Field(
        True, description="Ask upstream for return_token_ids and logprobs (vLLM, our engine)."
    )
    start_timeout_s: float = Field(60.0, gt=0, description="`up` waits this long for /healthz.")
