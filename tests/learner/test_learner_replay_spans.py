"""`replay --topic spans`: the live join's history re-run by a real Faust worker with other
reward shaping into a new transitions topic, exactly as the reference computes it for the new
settings, then trained into a new experiment (real broker, real worker, real MLflow, tiny model)."""

from __future__ import annotations

import math

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from mlflow import MlflowClient
from typer.testing import CliRunner

from infra import processes, services
from learner.replay import replay_spans
from schemas import Codec
from streams.replay import ReplayError
from streams.service import STREAMS
from testkit.learner import learner_settings
from testkit.workload import generate, interleave, reference
from tracetrain.cli import app

pytestmark = pytest.mark.integration

LIVE = {"credit": "identical", "idle_timeout_s": 6.0, "close_grace_s": 1.0}
SHAPED = {"credit": "discounted", "gamma": 0.5}
SHAPED_AIR = {"tool_ok": 0.25, "tool_raised": -1.0}


def _read_all(bootstrap: str, topic: str) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "t-read",
                         "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        out = []
        for p in meta.partitions:
            end = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            consumer.assign([TopicPartition(topic, p, 0)])
            while end and (not out or out[-1].partition() != p or out[-1].offset() < end - 1):
                out += [m for m in consumer.consume(500, timeout=1.0) if m.error() is None]
        return out
    finally:
        consumer.close()


def _produce(settings, events) -> None:
    codec = Codec()
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                         "partitioner": "murmur2_random", "enable.idempotence": True})
    for short, key, name, record in events:
        producer.produce(settings.topics.name(short), key=key.encode(), value=codec.encode(name, record))
    assert producer.flush(30) == 0


def _wait_live_join(settings, want: int, worker) -> None:
    """The live worker's transitions are all out (so the air topic holds its derived events)."""
    import time
    import urllib.request

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        got = len(_read_all(settings.kafka.bootstrap_servers, settings.topics.transitions))
        if got >= want:
            return
        time.sleep(1.0)
    metrics = urllib.request.urlopen(f"http://{worker.address}/metrics", timeout=5).read().decode()
    with open(worker.log, errors="replace") as f:
        log = f.read()[-2000:]
    raise AssertionError(f"the live worker emitted {got} of {want} transitions in 240 s\n"
                         f"{[m for m in metrics.splitlines() if m.startswith('tracetrain')]}\n{log}")


def test_spans_replay_reshapes_rewards_and_trains(kafka_settings, mlflow_server, tiny_model_dir):
    base = kafka_settings.model_copy(update={"mlflow": mlflow_server, "streams": kafka_settings.streams.model_copy(
        update={**LIVE, "web_port": processes.free_port()})})
    settings = learner_settings(base, tiny_model_dir, batch_size=8, advantage="batch",
                                checkpoint_every_steps=1, batch_timeout_s=30)
    rollouts = generate(80, seed=21, p_never_closed=0.05, p_duplicate=0.1, p_reward_first=0.1)
    events = interleave(rollouts, seed=21)
    _produce(settings, events)
    live_want = reference(rollouts, settings.streams)
    worker = services.start(settings, STREAMS, instance="streams-live-replay-test",
                            extra_argv=["--max-seconds", "300"])
    try:
        _wait_live_join(settings, len(live_want), worker)
    finally:
        processes.stop(settings.home_dir, worker.name, timeout_s=10)
    derived = _read_all(settings.kafka.bootstrap_servers, settings.topics.air)
    assert derived, "the live worker derived no AirEvents; the workload has tool spans"

    air = {**settings.streams.air_rules.model_dump(), **SHAPED_AIR}
    rebuilt, result = replay_spans(settings, experiment="shaped", start="0",
                                   streams_update={**SHAPED, "air_rules": air}, max_steps=2,
                                   max_seconds=300)

    # Copied: every span (duplicates too) and reward; no derived AirEvent (re-derived instead).
    assert rebuilt.copied["spans"] == sum(1 for e in events if e[0] == "spans")
    assert rebuilt.copied["rewards"] == sum(g.reward is not None for g in rollouts)
    assert rebuilt.copied.get("air", 0) == 0 and rebuilt.rollouts == len(rollouts)
    never = sum(g.reward is None for g in rollouts)
    assert rebuilt.closed.get("timeout", 0) == never and rebuilt.dlq.get("rollout_timeout", 0) == never

    # The new topic holds exactly the reference's transitions for the new shaping.
    shaped = rebuilt.settings.streams
    assert shaped.credit == "discounted" and shaped.air_rules.tool_ok == 0.25
    want = reference(rollouts, shaped)
    codec = Codec()
    got = {t["transition_id"]: t for t in (codec.decode(m.value(), "Transition") for m in _read_all(
        settings.kafka.bootstrap_servers, rebuilt.settings.topics.transitions))}
    assert set(got) == set(want) and rebuilt.transitions == len(want)
    for tid, exp in want.items():
        for name in ("credited_return", "intermediate_reward", "final_reward"):
            assert math.isclose(got[tid][name], exp[name], abs_tol=1e-6), (tid, name)
    changed = sum(not math.isclose(want[t]["credited_return"], live_want[t]["credited_return"],
                                   abs_tol=1e-6) for t in want)
    assert changed > len(want) // 4, "the new shaping should change many credited returns"

    # Trained from it into a new experiment; the version is registered under its own name.
    assert result is not None and result.steps == 2
    trained = [tid for step in result.ledger for tid in step]
    assert len(trained) == 16 and len(set(trained)) == 16 and set(trained) <= set(want)
    version = MlflowClient(tracking_uri=mlflow_server.uri).get_model_version_by_alias(
        f"{settings.mlflow.registered_model}-shaped", "latest")
    assert version.tags["step"] == "2" and rebuilt.settings.topics.transitions in version.tags["offsets"]

    with pytest.raises(ReplayError, match="exist already"):
        replay_spans(settings, experiment="shaped", start="0", train=False)


def test_spans_replay_options_are_checked_before_anything_runs():
    runner = CliRunner()
    bad_rule = runner.invoke(app, ["replay", "--topic", "spans", "--from", "0", "--experiment",
                                   "x", "--air-rule", "tool_great=1"])
    assert bad_rule.exit_code == 2 and "tool_great=1" in bad_rule.output
    bad_value = runner.invoke(app, ["replay", "--topic", "spans", "--from", "0", "--experiment",
                                    "x", "--credit", "sometimes"])
    assert bad_value.exit_code == 2 and "credit" in bad_value.output
    not_spans = runner.invoke(app, ["replay", "--from", "0", "--experiment", "x", "--gamma", "0.9"])
    assert not_spans.exit_code == 2 and "--topic spans" in not_spans.output
