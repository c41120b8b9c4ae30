"""`POST /v1/rewards` on the gateway: {rollout_id, value, final, name?, span_id?, task_id?,
agent_name?}. The body is read within the gateway's size and depth limits; invalid fields get
422 naming each one (ids must look like the gateway's id headers; a value that is not a finite
number within `settings.rewards.max_abs`: tracetrain.rewards), then `emit_reward`."""

from __future__ import annotations

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from producers.gateway.guard import check_auth, read_json_body
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
    span_id: str | None = Field(None, pattern=ID_PATTERN.pattern)
    task_id: str | None = Field(None, pattern=ID_PATTERN.pattern)
    agent_name: str | None = Field(None, pattern=ID_PATTERN.pattern)


def _invalid(exc: ValidationError) -> BadRequest:
    problems = [f"'{'.'.join(map(str, e['loc'])) or 'body'}': {e['msg']}" for e in exc.errors()]
    first = exc.errors()[0]["loc"]
    return BadRequest("invalid reward: " + "; ".join(problems), status=422,
                      param=str(first[0]) if first else None)


def add_reward_routes(app: FastAPI, state: dict, keys: list[bytes], limit: int,
                      max_depth: int) -> None:
    @app.post("/v1/rewards", status_code=202)
    async def post_reward(request: Request):
        check_auth(request, keys)
        try:
            reward = RewardIn.model_validate(await read_json_body(request, limit, max_depth))
        except ValidationError as exc:
            raise _invalid(exc) from exc
        problem = reward_problem(reward.value, state["pub"].settings.rewards.max_abs)
        if problem:  # before emit_reward: its other errors (publishing) are no 422
            raise BadRequest(f"value {problem}", status=422, param="value")
        record = emit_reward(state["pub"], **reward.model_dump())
        return {"accepted": True, "rollout_id": record["rollout_id"]}
