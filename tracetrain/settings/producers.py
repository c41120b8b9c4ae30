"""Settings of the producers: the Kafka publisher and its spool, the gateway, the tracer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

# librdkafka properties the publisher's promise rests on: not overridable through `librdkafka`.
PROTECTED_LIBRDKAFKA = ("bootstrap.servers", "enable.idempotence", "acks", "message.timeout.ms",
                        "message.max.bytes", "compression.type", "linger.ms", "batch.size",
                        "queue.buffering.max.messages")


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
    spool_max_mb: int = Field(
        1024, ge=2, description="Most the spool holds of records not yet delivered (a broker "
        "outage): past it, publish refuses (the gateway answers 503 with Retry-After) rather "
        "than fill the disk. 1 GiB holds ~100 s of the publisher at full speed (bench.producer: "
        "~10 MB/s of 1.4 KB spans), an hour of a gateway at 230 calls/s. At least two segments."
    )
    spool_full_retry_after_s: float = Field(
        5.0, gt=0, description="Retry-After of a refusal for a full spool or disk: a delivery "
        "frees a whole segment at a time, so sooner rarely helps."
    )
    message_max_bytes: int = Field(
        1_000_000, ge=1000, description="librdkafka's message.max.bytes (its default): the "
        "largest record handed to Kafka, lowered to fit each topic's max.message.bytes as read "
        "from the broker. Larger records are refused up front (the gateway: 413) or, when "
        "found later, moved to the spool's dead-letter file."
    )
    retry_backoff_ms: int = Field(
        500, ge=1, description="First wait before the spool is sent again after a delivery "
        "error (missing topic, producer failure); doubles up to retry_backoff_max_ms."
    )
    retry_backoff_max_ms: int = Field(30_000, ge=1)
    librdkafka: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Extra librdkafka producer properties (security, "
        "tuning), applied over ours except the ones our delivery promise rests on."
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Prometheus port for tracer/exporter processes."
    )

    @field_validator("librdkafka")
    @classmethod
    def _not_protected(cls, value: dict) -> dict:
        taken = sorted(set(value) & set(PROTECTED_LIBRDKAFKA))
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by tracetrain (use the publisher's own "
                             "settings where there is one); expected other librdkafka properties")
        return value

    @model_validator(mode="after")
    def _spool_holds_two_segments(self) -> PublisherSettings:
        if self.spool_max_mb < 2 * self.spool_segment_mb:
            raise ValueError(f"spool_max_mb {self.spool_max_mb} must be at least twice "
                             f"spool_segment_mb ({self.spool_segment_mb}): room is freed a "
                             "whole segment at a time")
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError(f"retry_backoff_max_ms {self.retry_backoff_max_ms} must be at "
                             f"least retry_backoff_ms ({self.retry_backoff_ms})")
        return self


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
