"""Settings of the Faust stream processors: rollout join, credit assignment, AIR rules."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class StreamsSettings(BaseModel):
    app_id: str = "tracetrain-streams"
    web_port: int = Field(6066, ge=1, le=65535)
    idle_timeout_s: float = Field(300.0, gt=0, description="A rollout with no events closes.")
    credit: Literal["identical", "air", "discounted"] = "identical"
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    select_agents: str | None = Field(None, description="Regex of agent names to train; None: all.")
    select_models: str | None = Field(None, description="Regex of model names to train; None: all.")
