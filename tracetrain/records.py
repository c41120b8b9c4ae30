"""The records on the topics, typed: one TypedDict per Avro record of `schemas/avsc/` (current
versions), the same names, fields and nesting; tests/core/test_records.py checks them against
the `.avsc` files.

    span: Span = {"trace_id": ..., "span_id": ..., "rollout_id": "r1", "kind": "llm", ...}
    codec.encode("Span", span)

A field the schema gives a default is `NotRequired`: a builder may leave it out and the codec
writes the default (a decoded record has every field). A nullable field (a union with null) is
`X | None`.
"""

# No `from __future__ import annotations` here: Python 3.11 reads NotRequired only from
# evaluated annotations, and the required/optional split is what the records are for.

from typing import Literal, NotRequired, TypedDict

from tracetrain.modes import LearnerMode

# Span attributes the gateway writes and the streams read. The sampling temperature the engine
# used (OpenTelemetry's GenAI name, so OTLP spans that carry it are read the same way), and the
# rollout's mode (tracetrain.modes.RolloutMode) when the caller gave one.
TEMPERATURE_ATTRIBUTE = "gen_ai.request.temperature"
MODE_ATTRIBUTE = "tracetrain.rollout_mode"

SpanKind = Literal["llm", "tool", "agent", "other"]
SpanStatus = Literal["ok", "error", "unset", "cancelled"]


class Resource(TypedDict):
    service: NotRequired[str]
    host: NotRequired[str]


class Usage(TypedDict):
    prompt_tokens: NotRequired[int]
    completion_tokens: NotRequired[int]


class LlmCall(TypedDict):
    model: str
    policy_version: NotRequired[int | None]
    request_messages: NotRequired[str]  # JSON list of chat messages
    response_text: NotRequired[str]
    prompt_token_ids: NotRequired[list[int]]
    response_token_ids: NotRequired[list[int]]
    response_logprobs: NotRequired[list[float]]
    finish_reason: NotRequired[str | None]
    usage: NotRequired[Usage | None]


class ToolCall(TypedDict):
    name: str
    arguments: NotRequired[str]  # JSON
    result: NotRequired[str | None]  # JSON
    ok: NotRequired[bool]


class Span(TypedDict):
    trace_id: str
    span_id: str
    parent_id: NotRequired[str | None]
    rollout_id: str
    attempt_id: NotRequired[str | None]
    task_id: NotRequired[str | None]
    agent_name: NotRequired[str]
    policy_name: NotRequired[str | None]
    kind: SpanKind
    start_time_ns: int
    end_time_ns: int
    status: NotRequired[SpanStatus]
    error_message: NotRequired[str | None]
    resource: NotRequired[Resource]
    attributes: NotRequired[dict[str, str]]
    llm: NotRequired[LlmCall | None]
    tool: NotRequired[ToolCall | None]


class Reward(TypedDict):
    rollout_id: str
    value: float
    final: NotRequired[bool]
    name: NotRequired[str | None]
    span_id: NotRequired[str | None]
    task_id: NotRequired[str | None]
    agent_name: NotRequired[str | None]
    timestamp_ns: int


class AirEvent(TypedDict):
    rollout_id: str
    span_id: str
    rule: str
    value: float
    source: NotRequired[str]  # "derived" by the streams' rules, or who sent it
    timestamp_ns: int


class Transition(TypedDict):
    transition_id: str
    rollout_id: str
    task_id: NotRequired[str | None]
    agent_name: NotRequired[str]
    span_id: NotRequired[str | None]
    model: NotRequired[str]
    turn_index: int
    is_last: bool
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    behaviour_logprobs: NotRequired[list[float]]
    policy_version: NotRequired[int | None]
    final_reward: float
    intermediate_reward: NotRequired[float]
    credited_return: float
    span_start_ns: NotRequired[int]
    emitted_ns: NotRequired[int]
    sampling_temperature: NotRequired[float | None]
    retokenized: NotRequired[bool]


class Checkpoint(TypedDict):
    model_name: str
    version: int
    policy_version: int
    run_id: str
    step: int
    mode: LearnerMode  # a plain string in the schema
    source: str
    base_model: NotRequired[str]
    offsets: NotRequired[dict[str, int]]  # "topic:partition" -> next offset to consume
    metrics: NotRequired[dict[str, float]]
    created_ns: int


# The top-level record of each schema name the codec knows.
RECORDS: dict[str, type] = {"Span": Span, "Reward": Reward, "AirEvent": AirEvent,
                            "Transition": Transition, "Checkpoint": Checkpoint}
