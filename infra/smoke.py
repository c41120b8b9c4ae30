"""`tracetrain smoke`: the local stack end to end, in a minute (the learning loop is
`tracetrain demo`, demo/run.py).

    tracetrain smoke [--spans 5]

Brings the stack up (Kafka, topics, MLflow), shows `tracetrain status`, publishes a few Avro
spans to the spans topic and reads them back, then stops what it started, and only that: a
stack that was already running (`tracetrain up`) makes `up` fail with its clear error and is
left as it was.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer
from rich.console import Console
from rich.table import Table

from infra import stack
from schemas import Codec
from tracetrain.records import Span
from tracetrain.settings import Settings


def _span(i: int, rollout_id: str) -> Span:
    now = time.time_ns()
    return {
        "trace_id": uuid.uuid4().hex, "span_id": f"demo-{i}", "parent_id": None,
        "rollout_id": rollout_id, "attempt_id": None, "task_id": "demo-task",
        "agent_name": "demo-agent", "policy_name": None, "kind": "llm",
        "start_time_ns": now, "end_time_ns": now + 1_000_000, "status": "ok",
        "error_message": None, "resource": {"service": "demo", "host": "localhost"},
        "attributes": {}, "tool": None,
        "llm": {"model": "smollm2-135m-instruct", "policy_version": 0,
                "request_messages": f'[{{"role": "user", "content": "What is {i} + {i}?"}}]',
                "response_text": str(2 * i), "prompt_token_ids": [1, 2, 3 + i],
                "response_token_ids": [4 + i], "response_logprobs": [-0.1],
                "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    }


def run(settings: Settings, n_spans: int, console: Console, show_status) -> int:
    """Returns the number of spans read back (equal to n_spans when all is well)."""
    started: list = []
    try:
        stack.up(settings, ["kafka", "mlflow"], started=started)
        show_status()
        codec, bootstrap = Codec(), settings.kafka.bootstrap_servers
        rollout_id = f"demo-{uuid.uuid4().hex[:8]}"
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "acks": "all"})
        for i in range(n_spans):
            producer.produce(settings.topics.spans, key=rollout_id.encode(),
                             value=codec.encode("Span", _span(i, rollout_id), settings.topics.spans))
        producer.flush(30)
        console.print(f"published {n_spans} spans of rollout {rollout_id} to {settings.topics.spans}")
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{rollout_id}",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([settings.topics.spans])
        table = Table("partition@offset", "span", "question", "answer")
        found, deadline = 0, time.monotonic() + 30
        while found < n_spans and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            span = codec.decode(msg.value(), "Span")
            if span["rollout_id"] != rollout_id:
                continue  # spans of an earlier demo run
            found += 1
            table.add_row(f"{msg.partition()}@{msg.offset()}", span["span_id"],
                          span["llm"]["request_messages"], span["llm"]["response_text"])
        consumer.close()
        console.print(table)
        console.print(f"read back {found}/{n_spans} spans")
        return found
    finally:
        stopped = stack.stop_started(settings, started)
        console.print(f"stopped {', '.join(stopped)}" if stopped else "stopped nothing")
