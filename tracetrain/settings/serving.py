"""Settings of the policy engines and the reloader (sections `engine` and `reloader`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, field_validator

from tracetrain.modes import EngineBackend, EngineWeights, RegistryAlias
from tracetrain.settings.urls import check_urls


class EngineSettings(BaseModel):
    backend: EngineBackend = Field(
        "embedded", description="'embedded' (llama.cpp's llama-server on CPU) or 'vllm' (GPU)."
    )
    host: str = "127.0.0.1"
    port: int = Field(8100, ge=1, le=65535)
    slots: int = Field(
        8, ge=1, description="Sequences generated at once (llama-server --parallel; vLLM "
        "--max-num-seqs at least this): continuous batching, each slot with max_context tokens."
    )
    weights: EngineWeights = Field(
        "f32", description="Base weights llama-server serves: 'f32' (exactly the learner's "
        "numbers: logprob gap ~0.002) or 'q4_1' (the default model's shipped file: faster at one "
        "request, gap ~0.08). Figures: python -m bench.logprobs."
    )
    max_requests_per_slot: int = Field(
        4, ge=1, description="Generation requests admitted per slot, running plus waiting; "
        "beyond slots x this the engine answers 429 with Retry-After instead of queueing without "
        "bound (4: a caller waits for a few generations at most)."
    )
    load_key: SecretStr | None = Field(
        None, description="Bearer key /v1/load_lora_adapter and /v1/load_checkpoint require; "
        "unset: a random key kept in <home>/engine/load_key (mode 0600), which a reloader with "
        "the same home reads, so the load endpoints are never open."
    )
    drain_timeout_s: float = Field(
        300.0, gt=0, description="After a swap, how long the old version may finish its requests."
    )
    max_context: int = Field(2048, ge=16, description="Prompt plus max_tokens may not exceed it.")
    default_max_tokens: int = Field(256, ge=1, description="max_tokens when a request omits it.")
    served_name: str = Field(
        "policy", description="Model name clients call; the base model's name is also accepted."
    )
    threads: int | None = Field(
        None, ge=1, description="llama-server threads; unset: llama.cpp's choice (all cores)."
    )
    start_timeout_s: float = Field(180.0, gt=0)
    # vLLM launcher only.
    max_lora_rank: int = Field(64, ge=1, description="vLLM --max-lora-rank.")
    vllm_args: list[str] = Field(default_factory=list, description="Extra `vllm serve` arguments.")


class ReloaderSettings(BaseModel):
    alias: RegistryAlias = Field(
        "latest", description="Registered-model alias the engine follows."
    )
    poll_s: float = Field(2.0, gt=0, description="Seconds between registry polls.")
    follow_checkpoints_topic: bool = Field(
        False, description="Also wake up on tracetrain.checkpoints events (needs Kafka)."
    )
    max_attempts: int = Field(
        3, ge=1, description="Loads tried per version before it is marked broken and skipped."
    )
    retry_s: float = Field(1.0, ge=0, description="First back-off between retries (doubles).")
    engine_url: str | None = Field(
        None, description="Engine base URL; unset means http://engine.host:engine.port."
    )
    engine_urls: list[str] = Field(
        default_factory=list, description="Every engine of a pool (base URLs, no /v1), which "
        "this one reloader brings to each new version, one engine at a time; empty: "
        "`engine_url` alone. As a variable, a JSON list: TRACETRAIN_RELOADER__ENGINE_URLS="
        "'[\"http://10.0.0.5:8100\", \"http://10.0.0.6:8100\"]'. The embedded engines of a pool "
        "share the load key and the download folder (one home, or engine.load_key and a shared "
        "download_dir)."
    )
    download_dir: Path | None = Field(
        None, description="Where versions are downloaded; the embedded engine loads only from "
        "under it. Unset: <home>/reloader/versions."
    )
    verify_timeout_s: float = Field(30.0, gt=0, description="Wait for the engine to report it.")
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(
        8300, ge=0, le=65535, description="`tracetrain reloader` serves /metrics, /healthz and "
        "/state here; 0 picks a free port."
    )

    @field_validator("engine_url")
    @classmethod
    def _one_url(cls, value: str | None) -> str | None:
        return None if value is None else check_urls([value], "http://127.0.0.1:8100")[0]

    @field_validator("engine_urls")
    @classmethod
    def _pool_urls(cls, value: list[str]) -> list[str]:
        return check_urls(value, "http://127.0.0.1:8100")
