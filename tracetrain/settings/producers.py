"""Settings of the producers: the Kafka publisher and its spool, the gateway, the tracer."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from tracetrain.settings.urls import check_urls

# librdkafka properties the publisher's promise rests on: not overridable through `librdkafka`.
PROTECTED_LIBRDKAFKA = ("bootstrap.servers", "enable.idempotence", "acks", "message.timeout.ms",
                        "message.max.bytes", "compression.type", "linger.ms", "batch.size",
                        "queue.buffering.max.messages", "enable.gapless.guarantee",
                        "max.in.flight.requests.per.connection", "max.in.flight")


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


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost); a name
    or a wildcard (0.0.0.0, ::) is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class GatewaySettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    upstream_url: str = Field(
        "http://127.0.0.1:8100/v1", description="The OpenAI-compatible engine, when there is one "
        "(several: `upstream_urls`).")
    upstream_urls: list[str] = Field(
        default_factory=list, description="The engines of a pool, each an OpenAI-compatible base "
        "URL; empty: `upstream_url` alone. As a variable, a JSON list: "
        "TRACETRAIN_GATEWAY__UPSTREAM_URLS='[\"http://10.0.0.5:8100/v1\", "
        "\"http://10.0.0.6:8100/v1\"]'. A rollout stays on one engine while it is healthy; a "
        "new one goes to the engine with the fewest calls in flight (producers/gateway/pool.py).")
    sticky_ttl_s: float = Field(
        600.0, gt=0, description="A rollout with no call for this long is forgotten: its next "
        "call goes to the least-loaded engine, like a new rollout's. Longer than an agent's "
        "pause between calls, or its prompt prefix is computed again elsewhere.")
    sticky_max: int = Field(
        100_000, ge=1, description="Rollouts whose engine the gateway remembers; beyond it the "
        "longest idle is forgotten first.")
    probe_timeout_s: float = Field(
        5.0, gt=0, description="An engine that takes longer than this to accept a connection, "
        "or to answer the probe of its `/models`, counts as failed: out of the pool until a "
        "probe answers in time.")
    api_keys: list[SecretStr] = Field(
        default_factory=list, description="Bearer keys, one of which every call must carry "
        "(`Authorization: Bearer <key>`): chat, completions, models, rewards, OTLP traces. As a "
        "variable, a JSON list: TRACETRAIN_GATEWAY__API_KEYS='[\"key-1\", \"key-2\"]'.")
    auth: Literal["auto", "on", "off"] = Field(
        "auto", description="'auto': keys are required when `host` is not a loopback address "
        "(anyone on the network could otherwise publish spans and rewards, i.e. train the "
        "policy), so such a gateway without keys refuses to start; 'on': always required; "
        "'off': never, even on the network (behind a proxy that authenticates).")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Larger requests get 413.")
    max_json_depth: int = Field(
        64, ge=8, description="Deepest nesting of a JSON body (objects and arrays); deeper is a "
        "400. Chat bodies nest a few levels, tool schemas a dozen; thousands would exhaust the "
        "parser's recursion and every later reader's.")
    held_spans_max: int = Field(
        10_000, ge=1, description="Spans held in memory when the publisher refuses one after the "
        "upstream answered (busy, spool full); at this many, new calls get 503 with Retry-After "
        "until the held ones are published.")
    upstream_api_key: SecretStr | None = Field(None, description="Bearer key sent upstream.")
    upstream_timeout_s: float = Field(300.0, gt=0)
    request_token_ids: bool = Field(
        True, description="Ask upstream for return_token_ids and logprobs (vLLM, our engine)."
    )
    start_timeout_s: float = Field(60.0, gt=0, description="`up` waits this long for /healthz.")
    spool_name: str = Field(
        "gateway", pattern=r"^[A-Za-z0-9._-]+$", description="The gateway's spool folder, "
        "<home>/spool/<spool_name>: a spool is locked by one process, so each gateway of one "
        "state folder needs its own (`up --profile production` names them gateway-1, gateway-2).")
    versions_refresh_s: float = Field(
        1.0, gt=0, description="How often the gateway reads each engine's model list "
        "(`/models`): whether it answers (a failed engine is taken back once it does), and its "
        "versioned adapter names (`policy-v<N>`, loaded by the reloader into vLLM, which "
        "reports no policy version): a call for `policy` goes to the newest, and its span gets "
        "that version. A new version reaches spans within this time of its load.")
    train_temperature: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="Sampling temperature forced on `train` "
        "traffic (X-Rollout-Mode: train): the learner scores what it trains on at the "
        "temperature it was sampled at, and 1.0 is the policy's own distribution.")
    default_temperature: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="Temperature sent upstream for a request "
        "that gives none, so the temperature recorded on its span is the one the engine used: "
        "1.0 is the default of the embedded engine, of OpenAI and of vLLM (unless the model's "
        "generation_config sets another, which this overrides).")

    @field_validator("upstream_url")
    @classmethod
    def _one_url(cls, value: str) -> str:
        return check_urls([value], "http://127.0.0.1:8100/v1")[0]

    @field_validator("upstream_urls")
    @classmethod
    def _pool_urls(cls, value: list[str]) -> list[str]:
        return check_urls(value, "http://127.0.0.1:8100/v1")

    def engine_urls(self) -> list[str]:
        """The engines calls go to: `upstream_urls`, or `upstream_url` alone."""
        return list(self.upstream_urls) or [self.upstream_url.rstrip("/")]

    def keys_required(self) -> bool:
        return self.auth == "on" or (self.auth == "auto" and not is_loopback(self.host))

    def auth_problem(self) -> str | None:
        """Why these settings may not serve (keys required, none given), or None."""
        if self.keys_required() and not self.api_keys:
            why = "gateway.auth is 'on'" if self.auth == "on" else \
                f"gateway.host {self.host!r} is not a loopback address"
            return (f"{why}, so every call needs an API key, and gateway.api_keys is empty: set "
                    "TRACETRAIN_GATEWAY__API_KEYS to a JSON list of keys, e.g. '[\"<key>\"]', "
                    "or bind 127.0.0.1, or set TRACETRAIN_GATEWAY__AUTH=off to serve without "
                    "keys on purpose")
        return None

    @model_validator(mode="after")
    def _keys_when_exposed(self) -> GatewaySettings:
        problem = self.auth_problem()
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _one_list_of_engines(self) -> GatewaySettings:
        # Both set and disagreeing: which one the operator meant cannot be told.
        default = type(self).model_fields["upstream_url"].default
        if self.upstream_urls and self.upstream_url not in (default, *self.upstream_urls):
            raise ValueError(f"upstream_url {self.upstream_url!r} is not among upstream_urls "
                             f"{self.upstream_urls}: list every engine in upstream_urls and "
                             "leave upstream_url unset")
        return self
