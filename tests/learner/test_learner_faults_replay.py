"""Exactly-once training effect across kill -9, and replay reproducing the live adapter.

One uninterrupted live run over 12 transitions (one partition, batches closed by size, so the
batches are the same in every run) is the reference for both tests."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import torch

from infra import processes, services, topics
from learner.checkpoints import CheckpointStore
from learner.loop import run_learner
from learner.replay import replay
from learner.service import LEARNER
from testkit.learner import learner_settings, make_transition, produce
from tracetrain.settings import load_settings
from tracetrain.settings.infra import TopicSettings

N, BATCH, STEPS = 12, 2, 6


@pytest.fixture(scope="module")
def live(kafka_broker, mlflow_server, tiny_model_dir, tmp_path_factory):
    tops = TopicSettings(prefix=f"t-faults-{uuid.uuid4().hex[:8]}", partitions=4)
    topics.create_topics(kafka_broker.bootstrap_servers, tops)
    base = load_settings(home=tmp_path_factory.mktemp("faults-home")).model_copy(
        update={"kafka": kafka_broker, "topics": tops, "mlflow": mlflow_server})
    settings = learner_settings(base, tiny_model_dir, batch_size=BATCH, advantage="batch",
                                checkpoint_every_steps=2, lr=5e-3, batch_timeout_s=60)
    records = [make_transition(i, ret=float(i % 2), response=[400 + i, 401, 2])
               for i in range(N)]
    produce(settings, records, partition=0)
    result = run_learner(settings, experiment="live", model_name="live-model",
                         until_step=STEPS, max_seconds=300)
    assert result.policy.step == STEPS
    return settings, records, result


def _close(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _crash_settings(settings, model: str):
    """The live run's settings with the crash run's own registered model and consumer group."""
    return settings.model_copy(update={
        "mlflow": settings.mlflow.model_copy(update={"registered_model": model}),
        "learner": settings.learner.model_copy(update={
            "group_id": f"{settings.learner.group_id}-crash"})})


@pytest.mark.integration
@pytest.mark.mlflow
@pytest.mark.faults
def test_kill9_then_resume_equals_uninterrupted_run(live, tmp_path):
    settings, records, reference = live
    model = "crash-model"
    store = CheckpointStore(settings, "crash", model)
    crash = _crash_settings(settings, model)
    # The learner service as `tracetrain up` starts it, with this run's bounds.
    record = services.start(crash, LEARNER, instance="learner-crash",
                            extra_argv=["--experiment", "crash", "--until-step", str(STEPS)])
    log = Path(record.log)
    try:
        deadline = time.monotonic() + 400
        while not store.versions() and time.monotonic() < deadline and \
                processes.pid_alive(record.pid):
            time.sleep(0.2)
        assert store.versions(), f"no checkpoint before the kill: {log.read_text()[-3000:]}"
        os.kill(record.pid, signal.SIGKILL)  # mid-training: version 1 (step 2) is registered
    finally:
        services.stop(crash, record.name, timeout_s=5)
    killed_at = len(store.versions())
    assert killed_at < STEPS // 2, "the learner finished before it was killed"
    resumed = run_learner(settings.model_copy(update={"learner": settings.learner.model_copy(
        update={"group_id": f"{settings.learner.group_id}-crash"})}),
        experiment="crash", model_name=model, until_step=STEPS, max_seconds=300)
    assert resumed.resumed_from is not None and resumed.policy.step == STEPS
    diff = _close(reference.policy.trainable_state(), resumed.policy.trainable_state())
    assert diff < 1e-5, diff
    # The learner's own record: the ledger in its last checkpoint lists every transition once.
    trained = [tid for ids in resumed.ledger for tid in ids]
    assert sorted(trained) == sorted(r["transition_id"] for r in records)
    assert resumed.counters["duplicate"] == 0


@pytest.mark.integration
@pytest.mark.mlflow
def test_replay_of_same_offsets_reproduces_the_live_adapter(live):
    settings, records, reference = live
    result = replay(settings, experiment="replayed", start="0", max_seconds=300)
    assert result.steps == STEPS and result.counters["accepted"] == N
    diff = _close(reference.policy.trainable_state(), result.policy.trainable_state())
    assert diff < 1e-5, diff
    latest = CheckpointStore(settings, "replayed", "x").client.get_model_version_by_alias(
        f"{settings.mlflow.registered_model}-replayed", "latest")
    assert latest.tags["step"] == str(STEPS)
    # A different learning rate gives a different model from the same history.
    other = settings.model_copy(update={"learner": settings.learner.model_copy(update={"lr": 1e-3})})
    changed = replay(other, experiment="replayed-lr", start="0", end="4", max_seconds=300)
    assert changed.steps == 2
    assert not torch.allclose(next(iter(changed.policy.trainable_state().values())),
                              next(iter(reference.policy.trainable_state().values())))
