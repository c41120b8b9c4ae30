"""Realistic example records of every schema, shared by the codec tests, the broker
tests and bench.codec."""

from __future__ import annotations

import json
import random


def span(rng: random.Random | None = None, prompt_tokens: int = 600, response_tokens: int = 200) -> dict:
    rng = rng or random.Random(0)
    return {
        "trace_id": f"{rng.getrandbits(128):032x}",
        "span_id": f"{rng.getrandbits(64):016x}",
        "parent_id": None,
        "rollout_id": f"rollout-{rng.randrange(10**6)}",
        "attempt_id": "a1",
        "task_id": f"task-{rng.randrange(1000)}",
        "agent_name": "writer",
        "policy_name": "calc",
        "kind": "llm",
        "start_time_ns": 1_700_000_000_000_000_000,
        "end_time_ns": 1_700_000_000_500_000_000,
        "status": "ok",
        "error_message": None,
        "resource": {"service": "calc-agent", "host": "worker-1"},
        "attributes": {"gen_ai.system": "openai", "http.route": "/v1/chat/completions"},
        "llm": {
            "model": "smollm2-135m-instruct",
            "policy_version": 7,
            "request_messages": json.dumps([{"role": "user", "content": "What is 17*23?" * 20}]),
            "response_text": "The answer is 391. " * 10,
            "prompt_token_ids": [rng.randrange(49152) for _ in range(prompt_tokens)],
            "response_token_ids": [rng.randrange(49152) for _ in range(response_tokens)],
            "response_logprobs": [-rng.random() * 5 for _ in range(response_tokens)],
            "finish_reason": "stop",
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": response_tokens},
        },
        "tool": None,
    }


def tool_span() -> dict:
    record = span()
    record.update(kind="tool", llm=None, span_id="tool-1",
                  tool={"name": "calc", "arguments": '{"expr": "17*23"}', "result": "391", "ok": True})
    return record


EXAMPLES = {
    "Span": span(),
    "Reward": {"rollout_id": "r1", "value": 1.0, "final": True, "name": "exact", "span_id": None,
               "task_id": "t1", "agent_name": "writer", "timestamp_ns": 5},
    "AirEvent": {"rollout_id": "r1", "span_id": "s1", "rule": "tool_ok", "value": 0.1,
                 "source": "derived", "timestamp_ns": 6},
    "Transition": {"transition_id": "r1:s1", "rollout_id": "r1", "task_id": "t1",
                   "agent_name": "writer", "span_id": "s1", "model": "m", "turn_index": 0,
                   "is_last": True, "prompt_token_ids": [1, 2, 3], "response_token_ids": [4, 5],
                   "behaviour_logprobs": [-0.5, -0.25], "policy_version": 3, "final_reward": 1.0,
                   "intermediate_reward": 0.1, "credited_return": 1.1, "span_start_ns": 1,
                   "emitted_ns": 2},
    "Checkpoint": {"model_name": "tracetrain-policy", "version": 2, "policy_version": 2,
                   "run_id": "abc", "step": 8, "mode": "rl", "source": "mlflow-artifacts:/x",
                   "base_model": "smollm2-135m-instruct", "offsets": {"tracetrain.transitions:0": 42},
                   "metrics": {"loss": 0.5}, "created_ns": 7},
}
