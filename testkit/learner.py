"""Helpers of the learner tests: Transition records, producing them to the transitions topic,
learner settings on a given model."""

from __future__ import annotations

import uuid

from infra.processes import free_port
from schemas import Codec


def make_transition(i: int, *, task: str | None = None, ret: float = 0.0, prompt=None,
                    response=None, version: int | None = 0, logprobs=None,
                    tid: str | None = None) -> dict:
    prompt = prompt if prompt is not None else [100 + i % 7, 200, 300 + i % 3]
    response = response if response is not None else [400 + i % 5, 500 + i % 11, 2]
    return {
        "transition_id": tid or f"tr-{i}-{uuid.uuid4().hex[:6]}",
        "rollout_id": f"ro-{i}",
        "task_id": task,
        "agent_name": "agent",
        "span_id": f"sp-{i}",
        "model": "tiny",
        "turn_index": 0,
        "is_last": True,
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "behaviour_logprobs": logprobs or [],
        "policy_version": version,
        "final_reward": ret,
        "intermediate_reward": 0.0,
        "credited_return": ret,
        "span_start_ns": 0,
        "emitted_ns": 0,
    }


def produce(settings, records, partition: int | None = 0, raw: list[bytes] = ()) -> None:
    """Write Transition records (and raw garbage values) to the transitions topic."""
    from confluent_kafka import Producer

    codec = Codec()
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    kw = {} if partition is None else {"partition": partition}
    for rec in records:
        producer.produce(settings.topics.transitions, key=rec["rollout_id"],
                         value=codec.encode("Transition", rec), **kw)
    for value in raw:
        producer.produce(settings.topics.transitions, key=b"bad", value=value, **kw)
    assert producer.flush(30) == 0


def learner_settings(base, model_dir, **learner):
    # its own status port: a learner process (the kill -9 test) never meets another's
    section = base.learner.model_copy(update={"group_id": f"g-{uuid.uuid4().hex[:8]}",
                                              "metrics_port": free_port(), **learner})
    return base.model_copy(update={"base_model": str(model_dir), "learner": section})
