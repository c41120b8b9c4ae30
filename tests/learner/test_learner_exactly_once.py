"""Exactly-once past today's bounds: duplicate detection beyond the dedupe window and across a
restart, one learner per experiment (fencing), a rebalance that does not go back to the offsets
of process start, a broker outage waited out (real broker, real MLflow, a tiny real model)."""

from __future__ import annotations

import sys
import threading
import time
import traceback
import uuid

import pytest
from confluent_kafka import Consumer
from test_learner_guards import _finite, _settings, _train_until

from infra import topics
from learner.batches import TransitionBatcher, tp_key
from learner.checkpoints import CheckpointStore
from learner.dedupe import BEYOND_WINDOW, DUPLICATE, DedupeWindow
from learner.errors import LearnerFenced
from learner.loop import run_learner
from testkit.learner import learner_settings, make_transition, produce
from tracetrain.settings import load_settings
from tracetrain.settings.infra import TopicSettings


def emitted(i: int, ns: int) -> dict:
    return {**make_transition(i, ret=float(i % 2)), "emitted_ns": ns}


def test_the_window_is_exact_past_its_capacity():
    window = DedupeWindow(2)
    first, second, third = emitted(0, 10), emitted(1, 20), emitted(2, 30)
    for t in (first, second, third):
        assert window.check(t) is None
        window.add(t)
    assert first["transition_id"] not in window and window.horizon_ns == 10
    assert window.check(first) == BEYOND_WINDOW  # forgotten, but recognised as maybe seen
    assert window.check(third) == DUPLICATE
    assert window.check(emitted(3, 11)) is None  # after the horizon: new for sure
    assert window.check(make_transition(4)) is None  # no emitted_ns: the window alone
    restored = DedupeWindow(2)
    restored.load_state_dict(window.state_dict())
    assert restored.check(first) == BEYOND_WINDOW and restored.check(third) == DUPLICATE


@pytest.mark.integration
@pytest.mark.mlflow
def test_a_duplicate_from_beyond_the_window_is_not_trained_after_a_restart(
        kafka_settings, mlflow_server, tiny_model_dir):
    settings = _settings(kafka_settings, mlflow_server, tiny_model_dir, batch_size=2,
                         dedupe_window=2)
    records = [emitted(i, 1000 + i) for i in range(4)]
    produce(settings, records)
    first = _train_until(settings, 2)
    assert len(first.checkpoints) == 2
    # The streams stage re-emits the first transition (a crash before its close was recorded):
    # the same id and emitted_ns, long out of a window of 2 ids.
    new = [emitted(4, 2000), emitted(5, 2001)]
    produce(settings, [records[0], *new])
    second = _train_until(settings, 1)
    assert second.resumed_from == 2
    assert second.counters["dlq:beyond_dedupe_window"] == 1
    # trained once, then never again: the new step holds the new transitions only
    assert sorted(second.ledger[-1]) == sorted(t["transition_id"] for t in new)


@pytest.mark.integration
@pytest.mark.mlflow
def test_two_learners_on_one_experiment_cannot_both_register(kafka_settings, mlflow_server,
                                                             tiny_model_dir):
    settings = _settings(kafka_settings, mlflow_server, tiny_model_dir, batch_size=1)
    name = settings.learner.group_id
    experiment, model = f"exp-{name}", f"m-{name}"
    store = CheckpointStore(settings, experiment, model)
    # no policy_version: with a checkpoint every step, none grows stale
    produce(settings, [make_transition(i, version=None) for i in range(2)], partition=0)
    outcome, stop = {}, threading.Event()

    def older():
        try:
            outcome["older"] = run_learner(settings, experiment=experiment, model_name=model,
                                           stop=stop, max_seconds=300)
        except LearnerFenced as exc:
            outcome["older"] = exc

    thread = threading.Thread(target=older)
    thread.start()
    deadline = time.monotonic() + 120
    while len(store.versions()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(store.versions()) == 2, "the first learner did not register"
    newer_stop, steps = threading.Event(), []

    def on_step(step, metrics):
        steps.append(step)
        if len(steps) >= 4:
            newer_stop.set()

    # Work for both on every partition once the newer one has joined the group.
    work = [make_transition(10 + i, version=None) for i in range(16)]
    threading.Timer(5.0, produce, (settings, work), {"partition": None}).start()
    taken_over = time.time() * 1000
    newer = run_learner(settings, experiment=experiment, model_name=model, stop=newer_stop,
                        max_seconds=300, on_step=on_step)
    stop.set()
    thread.join(120)
    assert newer.resumed_from == 2 and newer.checkpoints
    later = [v for v in store.versions() if v.creation_timestamp >= taken_over]
    assert {v.run_id for v in later} == {newer.checkpoints[0].run_id}, \
        f"versions of the fenced learner after the takeover: {later}"
    older_outcome = outcome["older"]
    # It either tried to register again and was fenced, or was never given work again.
    assert isinstance(older_outcome, LearnerFenced) or older_outcome.steps == 2, older_outcome


@pytest.mark.integration
def test_a_rebalance_resumes_where_reading_stopped_not_at_the_start(kafka_settings,
                                                                   tiny_model_dir):
    settings = learner_settings(kafka_settings, tiny_model_dir, batch_size=3,
                                batch_timeout_s=1.0)
    topic = settings.topics.transitions
    produce(settings, [make_transition(i) for i in range(3)], partition=0)
    # As resumed from a checkpoint: the offsets it holds are where reading starts.
    batcher = TransitionBatcher(settings, start_offsets={tp_key(topic, 0): 0})
    try:
        assert len(batcher.next_batch(0, first_wait_s=60)) == 3
        intruder = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                             "group.id": settings.learner.group_id})
        intruder.subscribe([topic])
        joined = threading.Event()

        def member():  # joins the group (a rebalance), stays a while, leaves (another one)
            deadline = time.monotonic() + 60
            while not intruder.assignment() and time.monotonic() < deadline:
                intruder.poll(0.2)
            joined.set()
            for _ in range(10):
                intruder.poll(0.2)
            intruder.close()

        thread = threading.Thread(target=member)
        thread.start()
        while thread.is_alive():
            batcher.next_batch(0, timeout_s=0.5, first_wait_s=0.5)
        assert joined.is_set()
        produce(settings, [make_transition(i) for i in range(3, 6)], partition=0)
        later = []
        deadline = time.monotonic() + 60
        while len(later) < 3 and time.monotonic() < deadline:
            batch = batcher.next_batch(0, timeout_s=1.0, first_wait_s=1.0)
            later += batch.transitions if batch else []
    finally:
        batcher.close()
    assert [t["rollout_id"] for t in later] == ["ro-3", "ro-4", "ro-5"]
    assert batcher.counters[DUPLICATE] == 0 and batcher.counters["consumed"] == 6


@pytest.mark.integration
@pytest.mark.mlflow
@pytest.mark.faults
def test_the_learner_waits_out_a_60_s_broker_outage(own_broker, mlflow_server, tiny_model_dir,
                                                    tmp_path):
    tops = TopicSettings(prefix=f"outage-{uuid.uuid4().hex[:8]}", partitions=2)
    topics.create_topics(own_broker.kafka.bootstrap_servers, tops)
    base = load_settings(home=tmp_path).model_copy(
        update={"kafka": own_broker.kafka, "topics": tops, "mlflow": mlflow_server})
    settings = learner_settings(base, tiny_model_dir, advantage="batch", batch_size=2,
                                checkpoint_every_steps=1, batch_timeout_s=2.0)
    produce(settings, [make_transition(i, ret=float(i % 2)) for i in range(2)])
    outcome, stop, steps = {}, threading.Event(), []

    def on_step(step, metrics):
        steps.append(step)
        if len(steps) >= 2:
            stop.set()

    def learner():
        try:
            outcome["result"] = run_learner(settings, experiment="outage", model_name="outage-m",
                                            stop=stop, max_seconds=400, on_step=on_step)
        except Exception as exc:  # what the test reports: the learner died
            outcome["error"] = exc

    thread = threading.Thread(target=learner, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not steps and time.monotonic() < deadline:
        time.sleep(0.2)
    assert steps, f"no step before the outage: {outcome}"
    own_broker.stop()
    time.sleep(60)
    assert thread.is_alive(), f"the learner died during the outage: {outcome}"
    own_broker.start()
    produce(settings, [make_transition(i, ret=float(i % 2)) for i in range(2, 4)])
    thread.join(300)
    assert not thread.is_alive(), "the learner did not take its second step after the outage:\n" \
        + "".join(traceback.format_stack(sys._current_frames()[thread.ident]))
    assert "error" not in outcome, outcome["error"]
    result = outcome["result"]
    assert result.steps == 2 and len(result.checkpoints) == 2 and _finite(result.policy)
