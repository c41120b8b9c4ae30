"""`POST /v1/rewards` on the gateway: {rollout_id, value, final, name?, span_id?, task_id?,
agent_name?}. Invalid bodies get 422 naming the field (FastAPI/pydantic; a value that is not a
finite number within `settings.rewards.max_abs`: tracetrain.rewards), then `emit_reward`."""

from __future__ import annotations

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from producers.gateway.guard import check_auth
from producers.gateway.ids import ID_PATTERN
from producers.rewards import emit_reward
from tracetrain.errors import BadRequest
from tracetrain.rewards import reward_problem


class RewardIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    rollout_id: str = Field(pattern=ID_PATTERN.pattern)
    value: float
    final: bool = True
    name: str | None = None
    span_id: str | None = None
    task_id: str | None = None
    agent_name: str | None = None


def add_reward_routes(app: FastAPI, state: dict, keys: set[str], limit: int) -> None:
    def auth(request: Request) -> None:
        check_auth(request, keys)

    @app.post("/v1/rewards", status_code=202, dependencies=[Depends(auth)])
    async def post_reward(reward: RewardIn):
        problem = reward_problem(reward.value, state["pub"].settings.rewards.max_abs)
        if problem:  # before emit_reward: its other errors (publishing) are no 422
            raise BadRequest(f"value {problem}", status=422, param="value")
        record = emit_reward(state["pub"], **reward.model_dump())
        return {"accepted": True, "rollout_id": record["rollout_id"]}
