"""Settings of the prompt optimiser (`tracetrain optimize-prompt`, section `optimizer`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr, field_validator

from tracetrain.settings.urls import check_urls


class OptimizerSettings(BaseModel):
    group_id: str = Field(
        "tracetrain-optimizer", description="Consumer group on spans and rewards: its own, so "
        "the streams worker's and the learner's positions are untouched; committed after a run "
        "registers its versions, so the next run learns from rollouts it has not seen."
    )
    max_records: int = Field(
        50_000, ge=1, description="Span and reward records read per run at most (a bound on the "
        "memory one run holds; the rest stays for the next run)."
    )
    agent: str = Field("calc", description="Agent name (span agent_name) whose rollouts are read.")
    worst_k: int = Field(
        6, ge=1, description="Lowest-reward rollouts shown to the optimiser LLM: SmolLM2-135M "
        "has a 2048-token context (engine.max_context), which a handful of transcripts fills."
    )
    llm_base_url: str | None = Field(
        None, description="OpenAI-compatible /v1 URL of the optimiser LLM that critiques and "
        "rewrites; unset: the engine the candidates are evaluated on (the embedded engine)."
    )
    llm_model: str = Field("policy", description="Model name sent to the optimiser LLM.")
    llm_api_key: SecretStr = Field(SecretStr("none"), description="Its bearer key, if any.")
    llm_temperature: float = Field(
        0.8, ge=0, description="Sampling temperature of rewrites: candidates must differ."
    )
    llm_max_tokens: int = Field(160, ge=16, description="Tokens of one critique or rewrite.")
    engine_url: str | None = Field(
        None, description="OpenAI-compatible /v1 URL the agent is evaluated on; unset: an "
        "engine of the command's own on a free port (as `tracetrain eval`), never the gateway, "
        "so evaluation traffic does not become training data."
    )
    rounds: int = Field(2, ge=1, description="Critique -> rewrite -> evaluate rounds.")
    candidates: int = Field(2, ge=1, description="Rewrites evaluated per round.")
    n_val: int = Field(
        48, ge=1, description="Validation problems each candidate is scored on (greedy): at "
        "~5% accuracy 48 problems tell 0 from 0.1, not 0.04 from 0.06; more costs a minute each."
    )
    val_seed: int = Field(
        2_000_003, description="Seed of the validation problems (calc `train` phrasings): "
        "neither the traffic's seeds (7 onwards) nor `tracetrain eval`'s held-out seed."
    )
    prompt_name: str = Field("calc-system", description="Prompt name in MLflow's prompt registry.")
    alias: str = Field("production", description="Alias moved to the best-scoring version.")
    threads: int = Field(8, ge=1, description="Validation problems solved at once.")

    @field_validator("llm_base_url", "engine_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_urls([value], "http://127.0.0.1:8100/v1")[0]
