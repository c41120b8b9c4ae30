"""The learner on the real broker and MLflow server, with a tiny real model."""

from __future__ import annotations

import json
import threading

import pytest
from confluent_kafka import Consumer, TopicPartition

from learner.batches import TransitionBatcher
from learner.loop import run_learner
from learner.metrics import LearnerMetrics, serve_status
from learner.trainer import PolicyTrainer
from schemas import Codec
from testkit.learner import learner_settings, make_transition, produce
from testkit.metrics import check_metrics, get_state
from tracetrain.deadletter import read_dead_letter_headers

GOOD, BAD = [410, 411, 412, 2], [610, 611, 612, 2]


def _settings(kafka_settings, mlflow_server, tiny_model_dir, **learner):
    base = kafka_settings.model_copy(update={"mlflow": mlflow_server})
    return learner_settings(base, tiny_model_dir, **learner)


def _read_all(settings, topic, n, timeout=20.0):
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                         "group.id": "reader", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    out = []
    import time
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            out.append(msg)
    consumer.close()
    return out


@pytest.mark.integration
@pytest.mark.mlflow
def test_rl_learner_from_kafka_moves_logprobs_and_registers(kafka_settings, mlflow_server,
                                                           tiny_model_dir):
    from mlflow import MlflowClient

    settings = _settings(kafka_settings, mlflow_server, tiny_model_dir, lr=5e-3, batch_size=4,
                         advantage="group", group_size=2, checkpoint_every_steps=2)
    records = []
    for i in range(16):  # 8 tasks, each with a rewarded and an unrewarded rollout
        good = i % 2 == 0
        records.append(make_transition(i, task=f"task-{i // 2}", ret=1.0 if good else 0.0,
                                       response=GOOD if good else BAD))
    produce(settings, records, partition=None)  # spread over the 4 partitions by key
    probe = [make_transition(99, response=GOOD), make_transition(98, response=BAD)]
    before = PolicyTrainer(settings, settings.home_dir / "probe").response_logprob_sums(probe)
    experiment = f"exp-{settings.learner.group_id}"
    model = f"m-{settings.learner.group_id}"
    stop, trained = threading.Event(), []

    def on_step(step, metrics):  # a bounded run: stop once every transition was trained
        trained.append(metrics["transitions"])
        if sum(trained) >= 16:
            stop.set()

    metrics = LearnerMetrics()  # served as `tracetrain learner` serves them (port 0: a free one)
    with serve_status(settings.learner.model_copy(update={"metrics_port": 0}), metrics) as server:
        result = run_learner(settings, experiment=experiment, model_name=model, stop=stop,
                             max_seconds=600, on_step=on_step, metrics=metrics)
        names = check_metrics(server.url, "learner")
        page = get_state(server.url)
    assert {"tracetrain_learner_trained_steps_total", "tracetrain_learner_input_records_total",
            "tracetrain_learner_policy_version", "tracetrain_learner_step_duration_seconds_bucket",
            "tracetrain_learner_registered_checkpoints_total"} <= names
    assert page["trained_steps"] == result.steps and page["trained_transitions"] == 16
    assert page["registered_checkpoints"] == len(result.checkpoints) == page["policy_version"]
    assert page["input_records"]["accepted"] == 16 and "loss" in page["last_step"]
    after = result.policy.response_logprob_sums(probe)
    assert sorted(t for ids in result.ledger for t in ids) == sorted(
        r["transition_id"] for r in records)
    assert result.steps >= 2
    assert after[0] > before[0] + 0.05, (before, after)  # high-advantage response rises
    assert after[1] < before[1] - 0.05, (before, after)  # low-advantage response falls

    client = MlflowClient(mlflow_server.uri)
    versions = sorted(client.search_model_versions(f"name='{model}'"), key=lambda v: int(v.version))
    n = len(result.checkpoints)
    assert n >= 1 and [v.version for v in versions] == [str(i + 1) for i in range(n)]
    latest = client.get_model_version_by_alias(model, "latest")  # MLflow's reserved alias
    assert latest.version == str(n)
    tags = latest.tags
    assert tags["mode"] == "rl" and tags["step"] == str(result.policy.step)
    assert tags["policy_version"] == str(n)
    assert tags["base_model"] == str(tiny_model_dir) and tags["experiment"] == experiment
    offsets = json.loads(tags["offsets"])
    assert sum(offsets.values()) == 16 and len(offsets) == 4
    assert all(tags[f"offset.{k}"] == str(v) for k, v in offsets.items())
    assert "metric.loss" in tags and "metric.grad_norm" in tags
    run = client.get_run(latest.run_id)
    for key in ("loss", "mean_reward", "mean_advantage", "kl", "grad_norm", "clip_fraction",
                "staleness", "tokens_per_s", "transitions_per_s"):
        assert key in run.data.metrics, key

    # Offsets committed for the group equal the registered ones.
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                         "group.id": settings.learner.group_id})
    parts = [TopicPartition(settings.topics.transitions, p) for p in range(4)]
    committed = {f"{p.topic}:{p.partition}": p.offset for p in consumer.committed(parts, 10)}
    consumer.close()
    assert committed == offsets

    events = [Codec().decode(m.value(), name="Checkpoint")
              for m in _read_all(settings, settings.topics.checkpoints, n)]
    assert [e["version"] for e in events] == list(range(1, n + 1))
    assert events[-1]["offsets"] == offsets and events[-1]["model_name"] == model


@pytest.mark.integration
def test_batcher_skips_duplicates_stale_and_malformed_with_reasons(kafka_settings,
                                                                    tiny_model_dir):
    settings = learner_settings(kafka_settings, tiny_model_dir, batch_size=50,
                                batch_timeout_s=3.0, max_staleness=2)
    ok = [make_transition(i, version=9) for i in range(3)]
    dup = dict(ok[0])
    stale = make_transition(10, version=5)  # 10 - 5 > 2
    empty = make_transition(11, response=[])
    produce(settings, [*ok, dup, stale, empty], raw=[b"", b"\xc3\x01garbage", b"junk-bytes"])
    batcher = TransitionBatcher(settings, vocab_size=49152)
    try:
        batch = batcher.next_batch(current_version=10, first_wait_s=60)
    finally:
        batcher.close()
    assert [t["transition_id"] for t in batch.transitions] == [t["transition_id"] for t in ok]
    assert batch.closed_by == "time"
    c = batcher.counters
    assert c["consumed"] == 9 and c["accepted"] == 3
    assert c["duplicate"] == 1 and c["stale"] == 1
    assert c["dlq:empty_response"] == 1 and c["dlq:empty"] == 1
    assert c["dlq:truncated"] + c["dlq:bad_magic"] + c["dlq:unknown_schema"] == 2
    dlq = _read_all(settings, settings.topics.dlq, 4)
    letters = [read_dead_letter_headers(m.headers()) for m in dlq]
    reasons = sorted(letter["reason"] for letter in letters)
    assert len(dlq) == 4 and "empty_response" in reasons and "empty" in reasons
    assert letters[0]["source_topic"] == settings.topics.transitions
    assert letters[0]["offset"] >= 0 and letters[0]["detail"]


@pytest.mark.integration
def test_batcher_downweights_stale_when_configured(kafka_settings, tiny_model_dir):
    settings = learner_settings(kafka_settings, tiny_model_dir, batch_size=2, max_staleness=1,
                                staleness_policy="downweight", staleness_weight=0.5)
    produce(settings, [make_transition(0, version=7), make_transition(1, version=None)])
    batcher = TransitionBatcher(settings)
    try:
        batch = batcher.next_batch(current_version=10, timeout_s=60)
    finally:
        batcher.close()
    assert batch.closed_by == "size" and batch.weights == [0.25, 1.0]
    assert batch.staleness == [3, 0] and batcher.counters["stale_downweighted"] == 1
