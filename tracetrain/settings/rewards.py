"""Settings of rewards, shared by every stage a reward passes: producers, streams, learner."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RewardSettings(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    max_abs: float = Field(
        1e6, gt=0,
        description="Largest |value| of a reward, an AIR value or a credited return; beyond it "
        "(or NaN, infinity) a reward is refused at the producers and dead-lettered by the streams "
        "join and the learner. Far above any sensible reward, and far enough inside float32 that "
        "a batch's squares and sums, advantages and the loss stay finite (1e200 overflowed the "
        "advantage normalisation; NaN trained a NaN adapter).",
    )
