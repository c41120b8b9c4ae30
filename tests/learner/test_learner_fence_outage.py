"""The fence through a broker outage that lands inside a checkpoint's transaction (real broker,
stopped and restarted; real MLflow for the newer-learner check)."""

from __future__ import annotations

import sys
import threading
import time
import traceback
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from infra import topics
from learner.checkpoints import CheckpointStore
from learner.fencing import Fence
from testkit.learner import make_transition, produce
from tracetrain.settings import load_settings
from tracetrain.settings.infra import TopicSettings


@pytest.mark.integration
@pytest.mark.faults
@pytest.mark.timeout(600)
def test_an_outage_inside_the_transaction_does_not_wedge_the_fence(own_broker, tmp_path):
    """The broker stops after the checkpoint is registered, before its announcement is produced
    and committed, and is back 75 s later. The announcement's delivery times out, the commit
    fails, and librdkafka's abort then timed out on every retry for good (hours, seen in the
    learner's outage test); the fence must recover and commit the next checkpoint."""
    tops = TopicSettings(prefix=f"fence-{uuid.uuid4().hex[:8]}", partitions=1)
    topics.create_topics(own_broker.kafka.bootstrap_servers, tops)
    settings = load_settings(home=tmp_path).model_copy(
        update={"kafka": own_broker.kafka, "topics": tops})
    produce(settings, [make_transition(i) for i in range(3)])
    group = f"fence-group-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({"bootstrap.servers": own_broker.kafka.bootstrap_servers,
                         "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([tops.transitions])

    def rejoin():  # as the learner does, reading its next batch before it checkpoints
        deadline = time.monotonic() + 120
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.5)
        for _ in range(4):
            consumer.poll(0.5)

    rejoin()
    assert consumer.assignment(), "the consumer joined no group"
    fence = Fence(settings, "exp", "m")
    key = f"{tops.transitions}:0"
    outcome: dict = {}

    def register_in_an_outage():
        own_broker.stop()
        threading.Timer(75, own_broker.start).start()
        return "v1"

    def announce(registered):
        return tops.checkpoints, b"m", registered.encode()

    def checkpoint():
        try:
            outcome["first"] = fence.commit({key: 1}, consumer.consumer_group_metadata,
                                            register_in_an_outage, announce, lambda _: None)
            rejoin()
            outcome["second"] = fence.commit({key: 3}, consumer.consumer_group_metadata,
                                             lambda: "v2", announce, lambda _: None)
        except Exception as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=checkpoint, daemon=True)
    thread.start()
    thread.join(420)
    try:
        assert not thread.is_alive(), "the fence is stuck after the broker came back:\n" + \
            "".join(traceback.format_stack(sys._current_frames()[thread.ident]))
        assert "error" not in outcome, outcome["error"]
        assert outcome == {"first": "v1", "second": "v2"}
        # The second checkpoint's offsets and announcement are committed; the first's are not.
        committed = consumer.committed([TopicPartition(tops.transitions, 0)], timeout=30)
        assert committed[0].offset == 3
    finally:
        consumer.close()
    reader = Consumer({"bootstrap.servers": own_broker.kafka.bootstrap_servers,
                       "group.id": f"reader-{uuid.uuid4().hex[:6]}",
                       "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    reader.subscribe([tops.checkpoints])
    seen, deadline = [], time.monotonic() + 60
    while "v2" not in seen and time.monotonic() < deadline:
        message = reader.poll(0.5)
        if message is not None and not message.error():
            seen.append(message.value().decode())
    reader.close()
    assert seen == ["v2"]


@pytest.mark.mlflow
def test_a_learner_knows_when_a_newer_one_started_on_its_experiment(mlflow_server, tmp_path):
    """What the fence asks before it replaces a wedged producer: it must never fence a learner
    started after this one (that one is the experiment's learner now)."""
    settings = load_settings(home=tmp_path).model_copy(update={"mlflow": mlflow_server})
    experiment = f"newer-{uuid.uuid4().hex[:8]}"
    older = CheckpointStore(settings, experiment, "m", announce=False)
    older.start_run("older", {})
    assert not older.newer_learner()
    time.sleep(0.05)  # start times are in milliseconds
    newer = CheckpointStore(settings, experiment, "m", announce=False)
    newer.start_run("newer", {})
    assert older.newer_learner() and not newer.newer_learner()
    newer.end_run()  # a learner that ended is not a rival
    assert not older.newer_learner()
    other = CheckpointStore(settings, f"{experiment}-other", "m", announce=False)
    other.start_run("elsewhere", {})
    assert not older.newer_learner(), "a learner on another experiment is no rival"
