"""A production rehearsal on this machine, without Docker: the production profile, started as
`tracetrain up --profile production` starts it (3 brokers with replication 3 and min ISR 2,
PostgreSQL and MLflow on it, 1 engine, 2 gateways, 2 streams workers, the learner as a 2-rank
torchrun job, the reloader), takes calc traffic through both gateways while one broker, one
streams worker and one learner rank are killed -9. Then every span whose call returned has
produced its transition exactly once (none dead-lettered), every registered version's adapter
is what one process gives that resumes from the version before and trains the same batches in
the same order, and no model version is registered twice.

What restarts what: the broker is started again by running the profile's `up` again (it starts
only what is not running); the streams worker by its supervisor (infra/supervise.py); the
learner rank by the job's supervisor, which starts the whole torchrun job again when torchrun
ends it after the rank died (the job resumes from its newest checkpoint).

Everything is real: the brokers, PostgreSQL, MLflow, the engine (llama-server on the default
model), the gateways, the Faust workers, torchrun and the learner. Kept small for a 2-core
machine: some 40 LLM calls, micro-batches of 4, the brokers on 256 MB heaps."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import torch
from confluent_kafka import Consumer, TopicPartition
from peft import get_peft_model_state_dict
from safetensors.torch import load_file

from examples.calc.agent import CalcAgent
from examples.calc.problems import generate
from infra import processes, profiles, stack
from learner.advantages import BatchAdvantage
from learner.batches import tp_key
from learner.checkpoints import CheckpointStore
from learner.trainer import PolicyTrainer
from producers.publisher import Publisher
from producers.tracer import Tracer
from schemas import Codec
from tracetrain.deadletter import read_dead_letter_headers
from tracetrain.settings import load_settings

pytestmark = [pytest.mark.rehearsal, pytest.mark.faults, pytest.mark.slow,
              pytest.mark.integration, pytest.mark.mlflow, pytest.mark.processes,
              pytest.mark.model]

ROLLOUTS = 24            # calc problems, half through each gateway (1 to 3 LLM calls each)
EXPERIMENT = "rehearsal"
# Each registered version is compared with one process that resumed from the version before
# and trained the same batches (one step a version here). 2 gloo ranks sum the gradient in
# another order than 1 process; Adam's lr * m / (sqrt(v) + eps) turns that, presumably, into
# a visible part of the step's update for the few elements whose moments are near eps.
# Measured on 2026-12-06 (5 runs, 8 segments each): a step resumed from a checkpoint differed
# by at most 5.6e-7 (29 of 35 segments by 0 or 1 ULP, 3.7e-9), so 5e-6 (9x); the first step,
# from zero moments, where every element's update is g / (|g| + eps) of its one gradient,
# by 3.7e-6, 3.7e-6, 3.0e-7, 4.8e-7 and 3.1e-7, so 1.5e-5 (4x). A batch trained otherwise (missing, repeated,
# reordered) moves many elements by about the learning rate, 1e-4, other ways: every
# segment's adapter must move at least 5x its tolerance (measured 6.7e-5 to 1e-4).
TOLERANCE = 5e-6
FIRST_STEP_TOLERANCE = 1.5e-5


def _settings(home: Path, model_dir: Path):
    base = load_settings(home=home, base_model=str(model_dir))
    sections = {
        "kafka": {"port": processes.free_ports(3), "controller_port": processes.free_ports(3), "heap_mb": 256},
        "topics": {"prefix": f"rh-{uuid.uuid4().hex[:6]}"},
        "postgres": {"port": processes.free_port()},
        "mlflow": {"port": processes.free_port(), "experiment": EXPERIMENT},
        "engine": {"port": processes.free_port()},
        "gateway": {"port": processes.free_ports(2)},
        "streams": {"web_port": processes.free_ports(2), "session_timeout_s": 10.0},
        # Small steps, each one checkpointed; no transition is too stale to train on, so the
        # ledger holds every transition.
        "learner": {"metrics_port": processes.free_port(), "batch_size": 4, "advantage": "batch",
                    "batch_timeout_s": 10.0, "checkpoint_every_steps": 1, "max_staleness": 1000,
                    "threads": 1, "max_length": 512},
        "reloader": {"metrics_port": processes.free_port()},
    }
    return profiles.override(base, sections)


class ShapedCalcAgent(CalcAgent):
    """The calc agent with a shaping term added to its final reward, 0.1 x (length of its last
    answer mod 5): the exact-answer reward alone is 0 for nearly every rollout of the 135M
    base model (a measured run: all of them), so every advantage would be 0, the adapter
    would never move and comparing it with a replay would prove nothing."""

    _last = ""

    def loop(self, *args, **kwargs):
        found = super().loop(*args, **kwargs)
        self._last = found[0]
        return found

    @contextmanager
    def rollout(self, task_id: str):
        with super().rollout(task_id) as (rollout_id, publish):
            yield rollout_id, lambda value: publish(value + 0.1 * (len(self._last) % 5))


class Traffic:
    """Calc agents, one thread per gateway, each rollout's LLM calls through that gateway;
    the span id of every call that returned (the gateway's `x-span-id`)."""

    def __init__(self, settings, urls: list[str]):
        self.returned: list[str] = []
        self.failed: list[str] = []
        self.done = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.publisher = Publisher(settings, name="rehearsal-agents")
        tracer = Tracer(self.publisher, agent="calc", service="rehearsal")
        problems = generate(ROLLOUTS, seed=11, difficulties=(1, 2))
        self.threads = [threading.Thread(target=self._work, args=(n, url, tracer, problems[n::2]),
                                         daemon=True) for n, url in enumerate(urls)]
        for thread in self.threads:
            thread.start()

    def _seen(self, response: httpx.Response) -> None:
        if response.status_code == 200 and "x-span-id" in response.headers:
            with self._lock:
                self.returned.append(response.headers["x-span-id"])

    def _work(self, n: int, url: str, tracer, problems) -> None:
        agent = ShapedCalcAgent(url, tracer)
        agent.client = openai.OpenAI(base_url=url, api_key="none", max_retries=2, timeout=300,
                                     http_client=httpx.Client(event_hooks={"response": [self._seen]},
                                                              timeout=300))
        for i, problem in enumerate(problems):
            if self.stop.is_set():
                return
            try:
                agent.solve(problem, task_id=f"rh-g{n}-{i}", seed=i)
            except Exception:  # shown in the assertion, not lost
                self.failed.append(traceback.format_exc())
            with self._lock:
                self.done += 1

    def __str__(self) -> str:
        return f"{len(self.returned)} calls returned, {self.done} rollouts done, failed: {self.failed}"

    def join(self) -> None:
        for thread in self.threads:
            thread.join(600)
        self.publisher.close()


def _descendants(record) -> list[psutil.Process]:
    try:
        return psutil.Process(record.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill_child(home: Path, name: str, rank: str | None = None) -> int:
    """SIGKILL the service's own process under its supervisor (with `rank`: the torchrun rank
    of that RANK); its pid."""
    record = processes.read_record(home, name)
    for proc in _descendants(record):
        try:
            if rank is None and proc.ppid() == record.pid or \
                    rank is not None and proc.environ().get("RANK") == rank:
                proc.kill()
                return proc.pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no process of {name} to kill (rank {rank})")


def _wait(check, timeout_s: float, what: str, poll_s: float = 1.0, context=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll_s)
    stacks = "\n".join(f"thread {ident}:\n{''.join(traceback.format_stack(frame))}"
                       for ident, frame in sys._current_frames().items())
    raise AssertionError(f"{what} within {timeout_s:.0f} s; {context() if context else ''}\n"
                         f"{stacks}")


def _read(settings, topic: str) -> list:
    """Every committed record of `topic`, from the start (read until 3 s bring nothing more)."""
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                         "group.id": f"rehearsal-check-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out, empty = [], 0
        while empty < 3:
            batch = consumer.consume(500, timeout=1.0)
            empty = 0 if batch else empty + 1
            out += [m for m in batch if m.error() is None]
        return out
    finally:
        consumer.close()


def _transitions(settings) -> list[tuple[int, int, dict]]:
    """(partition, offset, record) of every committed transition."""
    codec = Codec()
    return [(m.partition(), m.offset(), codec.decode(m.value(), "Transition"))
            for m in _read(settings, settings.topics.transitions)]


def _dead_lettered(settings, span_ids) -> dict[str, list[str]]:
    """The DLQ's reasons and details for each of `span_ids` that a dead letter holds (a span's
    own record, a rollout's summary listing it, a transition of it: each keeps the span id in
    its bytes)."""
    found: dict[str, list[str]] = {}
    for m in _read(settings, settings.topics.dlq):
        body = (m.key() or b"") + (m.value() or b"")
        letter = read_dead_letter_headers(m.headers())
        for span_id in span_ids:
            if span_id.encode() in body:
                found.setdefault(span_id, []).append(
                    f"{letter['reason']}: {letter['detail']} (from {letter['source_topic']}"
                    f"[{letter['partition']}]@{letter['offset']})")
    return found


def _learned_everything(store: CheckpointStore, settings, records):
    """The newest version, once its committed offsets are past every transition record."""
    versions = store.versions()
    if not versions:
        return None
    offsets = json.loads(versions[-1].tags["offsets"])
    last = {}
    for partition, offset, _ in records:
        last[partition] = max(last.get(partition, -1), offset)
    key = settings.topics.transitions
    done = all(offsets.get(tp_key(key, p), 0) > o for p, o in last.items())
    return versions if done else None


def test_production_profile_survives_a_broker_a_worker_and_a_rank_killed(tmp_path, base_model_dir):
    started_at = time.monotonic()
    settings = _settings(tmp_path / "home", base_model_dir)
    profile = profiles.PRODUCTION
    live = profile.settings(settings)
    home = settings.home_dir
    learner_settings = dict((i.name, i.settings(live)) for i in profile.instances)["learner"]
    leftovers: list[psutil.Process] = []
    names: set[str] = set()
    timings: dict[str, float] = {}
    try:
        stack.up_profile(settings, profile)  # what `tracetrain up --profile production` runs
        timings["up_s"] = time.monotonic() - started_at
        store = CheckpointStore(learner_settings, EXPERIMENT, live.mlflow.registered_model)
        names = {r.name for r in processes.records(home)}
        assert {"kafka-1", "kafka-2", "kafka-3", "postgres", "mlflow", "engine", "gateway-1",
                "gateway-2", "streams-1", "streams-2", "learner", "reloader"} <= names, names
        gateway_urls = [f"http://127.0.0.1:{live.gateway.port + i}/v1" for i in range(2)]
        traffic = Traffic(live, gateway_urls)

        # A broker dies; `up` run again starts it (and nothing else: the rest runs).
        _wait(lambda: len(traffic.returned) >= 6, 180, "6 calls returned", context=lambda: str(traffic))
        os.kill(processes.read_record(home, "kafka-2").pid, signal.SIGKILL)
        time.sleep(3)
        restarted = stack.up_profile(settings, profile)
        assert [r.name for r in restarted] == ["kafka-2"], restarted
        # A streams worker dies; its supervisor starts it again.
        _wait(lambda: len(traffic.returned) >= 14, 300, "14 calls returned", context=lambda: str(traffic))
        worker = _kill_child(home, "streams-1")
        # A learner rank dies once a checkpoint is registered; torchrun ends the job and the
        # supervisor starts it again, resuming from the checkpoint.
        _wait(store.versions, 300, "a first registered version", context=lambda: str(traffic))
        leftovers += _descendants(processes.read_record(home, "learner"))
        rank = _kill_child(home, "learner", rank="1")
        timings["kills_done_s"] = time.monotonic() - started_at

        traffic.join()
        timings["traffic_done_s"] = time.monotonic() - started_at
        assert not traffic.failed, traffic.failed
        returned = traffic.returned
        assert len(returned) >= ROLLOUTS, f"{len(returned)} calls for {ROLLOUTS} rollouts"

        # Every call that returned produced its transition, exactly once; none went to the DLQ
        # (a dead-lettered one fails at once, with the DLQ's reason, not after the wait).
        def all_arrived():
            records = _transitions(live)
            seen = {t["span_id"] for _, _, t in records}
            dead = _dead_lettered(live, returned)
            assert not dead, ("returned calls dead-lettered (span: reasons; "
                              f"{len(set(returned) - seen)} without a transition): {dead}")
            return records if set(returned) <= seen else None

        records = _wait(all_arrived, 180, "a transition of every returned call", poll_s=3)
        per_span = Counter(t["span_id"] for _, _, t in records)
        assert all(per_span[s] >= 1 for s in returned)
        # The stage is at-least-once with deterministic ids (DESIGN: a crash may write a
        # transition twice, the learner skips the copy): every copy of a span's transition must
        # be the same record. Checked last, so that the learner's checks run whatever this finds.
        copies: dict[str, list] = {}
        for p, o, t in records:
            copies.setdefault(t["span_id"], []).append((p, o, t))
        differing = [[(p, o, t["transition_id"]) for p, o, t in found]
                     for found in copies.values() if any(t != found[0][2] for _, _, t in found)]
        by_id = {t["transition_id"]: t for _, _, t in records}

        # The supervisors restarted what was killed.
        leftovers += _descendants(processes.read_record(home, "learner"))
        _wait(lambda: all(processes.healthy(r) for r in processes.records(home)), 300,
              "every process healthy again")
        assert worker not in {p.pid for p in _descendants(processes.read_record(home, "streams-1"))}
        assert rank not in {p.pid for p in _descendants(processes.read_record(home, "learner"))}

        # The learner trained on every transition, each once, and no version twice.
        versions = _wait(lambda: _learned_everything(store, live, records), 300,
                         "the learner to commit past every transition", poll_s=3)
        timings["learned_s"] = time.monotonic() - started_at
        steps = [int(v.tags["step"]) for v in versions]
        assert steps == sorted(set(steps)), f"a step registered twice: {steps}"
        assert len({v.source for v in versions}) == len(versions)
        assert len({v.tags["offsets"] for v in versions}) == len(versions)
        # The first job registered before its rank was killed, the restarted job after.
        assert len({v.run_id for v in versions}) >= 2, [v.run_id for v in versions]
        # Each version's checkpoint, fetched while MLflow runs: replayed after `down`.
        checkpoints = [(v, CheckpointStore.download(v, tmp_path / f"v{v.version}"))
                       for v in versions]
        states = [torch.load(local / "trainer_state.pt", weights_only=True)
                  for _, local in checkpoints]
        ledger = states[-1]["extra"]["ledger"]
        trained = [tid for ids in ledger for tid in ids]
        assert sorted(trained) == sorted(by_id), "not every transition trained exactly once"
        assert len(ledger) == steps[-1]
        # One lineage: each version's ledger is the newest one's up to its step.
        for step, state in zip(steps, states, strict=True):
            assert state["step"] == step and state["extra"]["ledger"] == ledger[:step], step
    finally:
        stopped = stack.down(settings)
        ranks_left = [p.pid for p in leftovers if _alive(p)]
        for proc in leftovers:  # ranks torchrun started in their own sessions
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
    # `down` stopped all of it, the learner's ranks with their job.
    assert set(stopped) >= names and processes.records(home) == [], stopped
    assert ranks_left == [], f"ranks outlived `down`: {ranks_left}"

    # Each version is what one process gives that resumes from the version before (the first:
    # from the base model) with the learner's own resume and trains the ledger's batches
    # between their steps. The live job trained those steps on 2 ranks (the first job, or the
    # one restarted after the kill, resuming from that same version).
    policy = PolicyTrainer(learner_settings, tmp_path / "replay", None)
    segments, previous = [], None
    for (version, local), step in zip(checkpoints, steps, strict=True):
        if previous is not None:
            policy.load(previous)
        start = policy.step
        before = {k: v.clone() for k, v in get_peft_model_state_dict(policy.model).items()}
        for ids in ledger[start:step]:
            batch = [dict(by_id[tid]) for tid in ids]
            policy.train_step(batch, BatchAdvantage().compute(batch), [1.0] * len(batch))
        adapter = load_file(local / "adapter" / "adapter_model.safetensors")
        segments.append({"version": int(version.version), "steps": f"{start}-{step}",
                         "diff": _diff(get_peft_model_state_dict(policy.model), adapter),
                         "moved": _diff(before, adapter), "job": version.run_id[:6],
                         "tolerance": FIRST_STEP_TOLERANCE if start == 0 else TOLERANCE})
        previous = local
    timings["total_s"] = time.monotonic() - started_at
    print(f"rehearsal: {len(returned)} calls, {len(records)} transitions, {len(versions)} "
          f"versions, timings {timings}\nsegments (version, steps, replay diff, moved, "
          "MLflow run of the job): " +
          "; ".join(f"v{s['version']} {s['steps']} {s['diff']:.3g} {s['moved']:.3g} {s['job']}"
                    for s in segments))
    # Each segment could fail: its adapter moved well above its tolerance.
    assert all(s["moved"] > 5 * s["tolerance"] for s in segments), segments
    assert all(s["diff"] < s["tolerance"] for s in segments), segments
    # (partition, offset, transition id) of each copy, for spans whose copies differ.
    assert differing == [], f"a span's transition written twice, differently: {differing}"


def _diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
