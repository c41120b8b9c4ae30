"""Settings of the policy engines and the reloader."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class EngineSettings(BaseModel):
    backend: Literal["embedded", "vllm"] = "embedded"
    host: str = "127.0.0.1"
    port: int = Field(8100, ge=1, le=65535)
    max_batch: int = Field(8, ge=1)
    max_context: int = Field(2048, ge=16)


class ReloaderSettings(BaseModel):
    alias: Literal["latest", "production"] = "latest"
    poll_s: float = Field(2.0, gt=0)
