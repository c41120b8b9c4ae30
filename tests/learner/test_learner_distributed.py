"""`tracetrain learner` under torchrun: 2 CPU ranks (gloo) are one learner. They train the
adapter one process trains from the same transitions, and a job whose rank 1 is killed -9
mid-run, restarted, ends with the adapter of the uninterrupted job, no version registered twice
(real broker, real MLflow, a tiny real model, real torchrun jobs). Each of TRL's loss
normalisations gives the single-process step on 2 ranks.

One partition and batches closed by size (3 transitions: the 2 ranks take 2 rows and 1 plus a
padding row), so the batches are the same in every run."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import psutil
import pytest
import torch
from safetensors.torch import load_file

from infra import topics
from infra.processes import free_port
from learner.advantages import BatchAdvantage
from learner.checkpoints import CheckpointStore
from learner.distributed import Ranks, join
from learner.errors import LearnerError
from learner.loop import run_learner
from learner.trainer import PolicyTrainer
from testkit import ranked_steps
from testkit.learner import learner_settings, make_transition, produce
from tracetrain.modes import LOSS_TYPES
from tracetrain.settings import load_settings
from tracetrain.settings.infra import TopicSettings

N, BATCH, STEPS = 12, 3, 4
# test_learner_faults_replay's tolerance. Data parallelism sums the gradient in another order
# (1e-7 relative); Adam's g / (sqrt(v) + eps) turns that into up to ~1% of a step's update for
# gradient elements near eps, so the runs use the default learning rate (1e-4), where that is
# below the tolerance; each adapter moves over 10x the tolerance (asserted).
TOLERANCE = 1e-5


def _topics(kafka_broker, name: str) -> TopicSettings:
    tops = TopicSettings(prefix=f"t-ddp-{name}-{uuid.uuid4().hex[:8]}", partitions=4)
    topics.create_topics(kafka_broker.bootstrap_servers, tops)
    return tops


@pytest.fixture(scope="module")
def history(kafka_broker, mlflow_server, tiny_model_dir, tmp_path_factory):
    base = load_settings(home=tmp_path_factory.mktemp("ddp-home")).model_copy(update={
        "kafka": kafka_broker, "topics": _topics(kafka_broker, "live"), "mlflow": mlflow_server})
    settings = learner_settings(base, tiny_model_dir, batch_size=BATCH, advantage="batch",
                                checkpoint_every_steps=2, batch_timeout_s=60)
    # responses of 3 to 5 tokens: rows a rank pads to the batch's length
    records = [make_transition(i, ret=float(i % 2), response=[400 + i, 401, 2, *[5] * (i % 3)])
               for i in range(N)]
    produce(settings, records, partition=0)
    return settings, records


def _own(settings, name: str):
    """`settings` with a job's own registered model, consumer group and status port (named
    apart from other modules' on the session's MLflow server)."""
    return settings.model_copy(update={
        "mlflow": settings.mlflow.model_copy(update={"registered_model": f"ddp-{name}-model"}),
        "learner": settings.learner.model_copy(update={
            "group_id": f"{settings.learner.group_id}-{name}", "metrics_port": free_port()})})


def _finish(job, timeout_s: float = 600) -> dict:
    """Wait for a torchrun job that must succeed; its rank 0's JSON report."""
    rc = job.wait(timeout_s)
    text = job.log.read_text()
    assert rc == 0, text[-6000:]
    reports = [json.loads(line) for line in text.splitlines() if line.startswith('{"steps"')]
    assert len(reports) == 1, f"one report expected, from rank 0 alone: {reports}"
    return reports[0]


def _latest(settings, experiment: str, into) -> tuple[object, dict, dict]:
    """The experiment's newest version, its adapter and its checkpoint's extra state."""
    store = CheckpointStore(settings, experiment, settings.mlflow.registered_model)
    version, local = store.latest(into)
    adapter = load_file(local / "adapter" / "adapter_model.safetensors")
    extra = torch.load(local / "trainer_state.pt", weights_only=True)["extra"]
    return version, adapter, extra


def _diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _moved(adapter: dict) -> float:
    """How far training took the adapter: LoRA's B matrices start at zero."""
    return max(float(v.abs().max()) for k, v in adapter.items() if "lora_B" in k)


@pytest.fixture(scope="module")
def one_process(history):
    from peft import get_peft_model_state_dict

    settings, _ = history
    result = run_learner(_own(settings, "one"), experiment="ddp-one", until_step=STEPS,
                         max_seconds=300)
    assert result.policy.step == STEPS
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(result.policy.model).items()}


@pytest.fixture(scope="module")
def two_ranks(history, torchrun, tmp_path_factory):
    settings, _ = history
    own = _own(settings, "two")
    job = torchrun(own, 2, "--experiment", "ddp-two", "--until-step", str(STEPS))
    report = _finish(job)
    return report, job.log.read_text(), _latest(own, "ddp-two", tmp_path_factory.mktemp("two"))


def test_two_ranks_train_the_adapter_one_process_trains(history, one_process, two_ranks):
    _, records = history
    report, log, (version, adapter, extra) = two_ranks
    assert report["steps"] == STEPS and len(report["versions"]) == STEPS // 2
    assert version.tags["step"] == str(STEPS)
    assert "rank 1 of 2 (gloo)" in log and f"rank 1: {STEPS} steps" in log, log[-4000:]
    assert _moved(one_process) > 10 * TOLERANCE
    diff = _diff(one_process, adapter)
    assert diff < TOLERANCE, diff
    trained = [tid for ids in extra["ledger"] for tid in ids]
    assert sorted(trained) == sorted(r["transition_id"] for r in records)


def _rank_pid(job, rank: int) -> int:
    for child in psutil.Process(job.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child.pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no rank {rank} under torchrun {job.pid}")


@pytest.mark.faults
def test_kill9_of_rank_1_then_restart_equals_the_uninterrupted_job(
        history, kafka_broker, two_ranks, one_process, torchrun, tmp_path):
    live, records = history
    crash = _own(live.model_copy(update={"topics": _topics(kafka_broker, "crash")}), "crash")
    store = CheckpointStore(crash, "ddp-crash", crash.mlflow.registered_model)
    # The first two batches only: the job registers step 2 and waits for the third batch,
    # mid-run, when rank 1 is killed (not finished, whenever the kill lands).
    produce(crash, records[:6], partition=0)
    job = torchrun(crash, 2, "--experiment", "ddp-crash", "--until-step", str(STEPS))
    deadline = time.monotonic() + 300
    while not store.versions() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
    assert store.versions(), job.log.read_text()[-6000:]
    os.kill(_rank_pid(job, 1), signal.SIGKILL)
    started = time.monotonic()
    rc = job.wait(120)  # the other rank is stopped with it: the job ends
    assert rc != 0, job.log.read_text()[-6000:]
    stopped_s = time.monotonic() - started
    assert [v.tags["step"] for v in store.versions()] == ["2"]

    produce(crash, records[6:], partition=0)
    report = _finish(torchrun(crash, 2, "--experiment", "ddp-crash", "--until-step", str(STEPS)))
    assert report["resumed_from"] == 1 and report["steps"] == STEPS // 2
    steps = [v.tags["step"] for v in store.versions()]
    assert steps == ["2", str(STEPS)], f"a step registered twice, or one missing: {steps}"
    _, adapter, extra = _latest(crash, "ddp-crash", tmp_path)
    uninterrupted = two_ranks[2][1]
    assert _diff(uninterrupted, adapter) < TOLERANCE
    assert _diff(one_process, adapter) < TOLERANCE
    trained = [tid for ids in extra["ledger"] for tid in ids]
    assert sorted(trained) == sorted(r["transition_id"] for r in records), "not exactly once"
    assert stopped_s < 60, f"the job took {stopped_s:.0f} s to stop after rank 1 died"


def test_shards_cover_a_batch_once_in_near_equal_parts():
    for world in (1, 2, 3, 8):
        for rows in range(0, 20):
            parts = [Ranks(r, world, r, None).shard(rows) for r in range(world)]
            assert [i for start, stop in parts for i in range(start, stop)] == list(range(rows))
            assert max(b - a for a, b in parts) - min(b - a for a, b in parts) <= 1


def test_a_mode_that_cannot_be_split_is_refused_under_torchrun(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    settings = load_settings(home=tmp_path)
    sft = settings.model_copy(update={"learner": settings.learner.model_copy(update={"mode": "sft"})})
    with pytest.raises(LearnerError, match="'sft' with WORLD_SIZE=2: expected 'rl'"):
        join(sft)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert join(sft) is None  # one process: no torch.distributed at all


def _in_parts(settings, tokens: int):
    return settings.model_copy(update={"learner": settings.learner.model_copy(
        update={"max_step_tokens": tokens})})


def test_every_loss_type_takes_the_one_process_step_on_two_ranks(torchrun, tiny_model_dir,
                                                                  tmp_path):
    """Each rank also takes its 2 rows in 2 parts (`max_step_tokens` below one row): rank 1's
    second part is its padding row alone, and only the last part's backward all-reduces."""
    settings = load_settings(home=tmp_path).model_copy(update={"base_model": str(tiny_model_dir)})
    job = torchrun(_in_parts(settings, 1), 2, str(tmp_path), *LOSS_TYPES,
                   module="testkit.ranked_steps")
    assert job.wait(600) == 0, job.log.read_text()[-6000:]
    for loss_type in LOSS_TYPES:
        one = ranked_steps.train(PolicyTrainer(ranked_steps.with_loss(settings, loss_type),
                                               tmp_path / loss_type))
        two = torch.load(tmp_path / f"{loss_type}.pt")
        assert _moved(one) > 10 * TOLERANCE, loss_type
        assert _diff(one, two) < TOLERANCE, (loss_type, _diff(one, two))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_a_batch_taken_in_parts_takes_the_one_pass_step(tiny_model_dir, tmp_path, loss_type):
    """`max_step_tokens` bounds the tokens of one forward (a long micro-batch would not fit in
    memory otherwise): the batch of 3 rows goes through in 3 passes of 1 row, and the
    accumulated step is the one-pass step of the same loss normalisation."""
    settings = ranked_steps.with_loss(load_settings(home=tmp_path).model_copy(
        update={"base_model": str(tiny_model_dir)}), loss_type)
    one, one_losses = _steps(PolicyTrainer(settings, tmp_path / "one"))
    parted = PolicyTrainer(_in_parts(settings, 8), tmp_path / "parts")
    rows: list[int] = []

    def count(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        rows.append(ids.size(0))

    parted.model.register_forward_pre_hook(count, with_kwargs=True)
    two, losses = _steps(parted)
    assert rows and max(rows) == 1, rows  # each row alone (prompt + response > 8 tokens)
    # the parts' weights add up to the batch's loss (Adam alone would hide a common factor)
    assert losses == pytest.approx(one_losses, rel=1e-5, abs=1e-7), (losses, one_losses)
    assert _moved(one) > 10 * TOLERANCE, loss_type
    assert _diff(one, two) < TOLERANCE, (loss_type, _diff(one, two))


def _steps(policy: PolicyTrainer) -> tuple[dict[str, torch.Tensor], list[float]]:
    """ranked_steps' batches trained by `policy`: its weights, and each step's loss."""
    losses = [policy.train_step(batch, BatchAdvantage().compute(batch), [1.0] * len(batch))["loss"]
              for batch in ranked_steps.batches()]
    return policy.trainable_state(), losses


def _full(settings):
    # a collective that ranks miss fails in a minute, not in the default five
    return settings.model_copy(update={"learner": settings.learner.model_copy(
        update={"full_finetune": True, "collective_timeout_s": 60})})


def test_full_finetune_is_sharded_with_fsdp_and_takes_the_one_process_step(
        torchrun, tiny_model_dir, tmp_path):
    """A full fine-tune on 2 ranks (`dist_strategy` auto: FSDP2) holds half of every weight
    per rank, trains the weights one process trains, checkpoints the whole model as one
    process does, and resumes from it (weights and Adam state). The same TOLERANCE as DDP's,
    for the same reason: only the order the gradient is summed in differs (a reduce-scatter
    instead of an all-reduce), which Adam amplifies near eps; every weight matrix moves."""
    settings = _full(load_settings(home=tmp_path).model_copy(
        update={"base_model": str(tiny_model_dir)}))
    job = torchrun(settings, 2, str(tmp_path), "grpo", module="testkit.ranked_steps")
    assert job.wait(600) == 0, job.log.read_text()[-6000:]

    held = json.loads((tmp_path / "grpo.shards.json").read_text())
    for name, (local, whole, placement) in held.items():
        assert placement == "(Shard(dim=0),)", (name, placement)  # DDP: "whole"
        assert local <= -(-whole // 2), (name, local, whole)
    assert sum(h[0] for h in held.values()) * 2 == pytest.approx(
        sum(h[1] for h in held.values()), rel=0.01)

    mine = ranked_steps.with_loss(settings, "grpo")
    one = PolicyTrainer(mine, tmp_path / "one")
    trained = ranked_steps.train(one)
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert min(float((trained[k] - initial[k]).abs().max()) for k in trained) > 10 * TOLERANCE
    two = torch.load(tmp_path / "grpo.pt")
    assert _diff(trained, two) < TOLERANCE, _diff(trained, two)

    # rank 0's checkpoint is one process's: the whole model, the optimizer numbered alike
    saved = load_file(tmp_path / "grpo-ckpt" / "model" / "model.safetensors")
    one.save(tmp_path / "one-ckpt", {})
    alone = load_file(tmp_path / "one-ckpt" / "model" / "model.safetensors")
    assert _diff(alone, saved) < TOLERANCE
    states = [torch.load(d / "trainer_state.pt", weights_only=True)["optimizer"]
              for d in (tmp_path / "one-ckpt", tmp_path / "grpo-ckpt")]
    assert states[0]["param_groups"] == states[1]["param_groups"]
    assert _diff({k: v["exp_avg_sq"] for k, v in states[0]["state"].items()},
                 {k: v["exp_avg_sq"] for k, v in states[1]["state"].items()}) < TOLERANCE
    # a resumed sharded job trains on as one process resumed from the same checkpoint
    resumed = PolicyTrainer(mine, tmp_path / "one-resumed")
    resumed.load(tmp_path / "grpo-ckpt")
    again = ranked_steps.train(resumed)
    assert _diff(again, trained) > 10 * TOLERANCE  # it trained on
    assert _diff(again, torch.load(tmp_path / "grpo-resumed.pt")) < TOLERANCE


def test_fsdp_without_full_finetune_is_refused(tmp_path):
    settings = load_settings(home=tmp_path)
    with pytest.raises(ValueError, match="dist_strategy 'fsdp' with learner.full_finetune false"):
        settings.learner.model_validate({**settings.learner.model_dump(), "dist_strategy": "fsdp"})
    with pytest.raises(ValueError, match="'auto', 'ddp' or 'fsdp'"):
        settings.learner.model_validate({**settings.learner.model_dump(), "dist_strategy": "zero"})
    assert settings.learner.model_validate(
        {**settings.learner.model_dump(), "full_finetune": True}).sharded
    assert not settings.learner.sharded
