"""Builders of complete Span and Reward dicts (schemas/avsc/Span.v3, Reward.v1) with defaults.

    span = new_span("llm", rollout_id="r1", llm=llm_part(model="m", ...))

Every producer (gateway, tracer, OTel exporter) builds its records here so that they agree.
"""

from __future__ import annotations

import random
import socket
import time
import uuid

from tracetrain.records import LlmCall, Reward, Span, SpanKind, SpanStatus, ToolCall, Usage

_HOST = socket.gethostname()


def new_id(nbytes: int = 8) -> str:
    # Ids need uniqueness, not secrecy; getrandbits is several times cheaper than urandom and
    # Python reseeds it in forked children.
    return f"{random.getrandbits(nbytes * 8):0{nbytes * 2}x}"


def new_rollout_id() -> str:
    return f"ro-{uuid.uuid4().hex}"


def new_span(kind: SpanKind, rollout_id: str, *, trace_id: str | None = None, span_id: str | None = None,
             parent_id: str | None = None, attempt_id: str | None = None,
             task_id: str | None = None, agent_name: str = "", policy_name: str | None = None,
             start_time_ns: int | None = None, end_time_ns: int | None = None,
             status: SpanStatus = "ok", error_message: str | None = None, service: str = "",
             attributes: dict[str, str] | None = None, llm: LlmCall | None = None,
             tool: ToolCall | None = None) -> Span:
    now = time.time_ns()
    return {
        "trace_id": trace_id or new_id(16),
        "span_id": span_id or new_id(8),
        "parent_id": parent_id,
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "task_id": task_id,
        "agent_name": agent_name or "",
        "policy_name": policy_name,
        "kind": kind,
        "start_time_ns": start_time_ns if start_time_ns is not None else now,
        "end_time_ns": end_time_ns if end_time_ns is not None else now,
        "status": status,
        "error_message": error_message,
        "resource": {"service": service, "host": _HOST},
        "attributes": attributes or {},
        "llm": llm,
        "tool": tool,
    }


def llm_part(model: str, *, policy_version: int | None = None, request_messages: str = "[]",
             response_text: str = "", prompt_token_ids: list[int] | None = None,
             response_token_ids: list[int] | None = None,
             response_logprobs: list[float] | None = None, finish_reason: str | None = None,
             prompt_tokens: int | None = None, completion_tokens: int | None = None) -> LlmCall:
    usage: Usage | None = None
    if prompt_tokens is not None or completion_tokens is not None:
        usage = {"prompt_tokens": int(prompt_tokens or 0),
                 "completion_tokens": int(completion_tokens or 0)}
    return {
        "model": model,
        "policy_version": policy_version,
        "request_messages": request_messages,
        "response_text": response_text,
        "prompt_token_ids": list(prompt_token_ids or []),
        "response_token_ids": list(response_token_ids or []),
        "response_logprobs": [float(x) for x in (response_logprobs or [])],
        "finish_reason": finish_reason,
        "usage": usage,
    }


def tool_part(name: str, arguments: str = "{}", result: str | None = None, ok: bool = True) -> ToolCall:
    return {"name": name, "arguments": arguments, "result": result, "ok": ok}


def new_reward(rollout_id: str, value: float, *, final: bool = True, name: str | None = None,
               span_id: str | None = None, task_id: str | None = None,
               agent_name: str | None = None, timestamp_ns: int | None = None) -> Reward:
    return {
        "rollout_id": rollout_id,
        "value": float(value),
        "final": final,
        "name": name,
        "span_id": span_id,
        "task_id": task_id,
        "agent_name": agent_name,
        "timestamp_ns": timestamp_ns if timestamp_ns is not None else time.time_ns(),
    }
