"""Settings of the continuous learner: batching, advantages, TRL mode, checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class LearnerSettings(BaseModel):
    group_id: str = "tracetrain-learner"
    mode: Literal["rl", "sft", "kto"] = "rl"
    advantage: Literal["group", "batch", "baseline"] = "group"
    batch_size: int = Field(8, ge=1, description="Transitions per micro-batch.")
    batch_timeout_s: float = Field(30.0, gt=0, description="A partial micro-batch closes after this.")
    lr: float = Field(1e-4, gt=0)
    lora_r: int = Field(8, ge=1)
    full_finetune: bool = False
    max_staleness: int = Field(4, ge=0, description="Versions behind the current one tolerated.")
    staleness_policy: Literal["drop", "downweight"] = "drop"
    checkpoint_every_steps: int = Field(4, ge=1)
    seed: int = 0
