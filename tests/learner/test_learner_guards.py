"""The learner never trains on, or registers, something broken: rewards out of bounds and
non-finite logprobs are dead-lettered at its batcher; a step whose loss is not finite is
skipped; a policy that scores non-finite on the probe set is never registered; checkpoint
state is read without unpickling (real broker, real MLflow, a tiny real model)."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from test_learner_kafka import _read_all

from learner.checkpoints import CheckpointStore
from learner.errors import LearnerError
from learner.loop import run_learner
from learner.trainer import PolicyTrainer
from testkit.learner import learner_settings, make_transition, produce
from tracetrain.deadletter import read_dead_letter_headers
from tracetrain.settings import load_settings


def _settings(kafka_settings, mlflow_server, tiny_model_dir, **learner):
    base = kafka_settings.model_copy(update={"mlflow": mlflow_server})
    return learner_settings(base, tiny_model_dir, advantage="batch", checkpoint_every_steps=1,
                            batch_timeout_s=2.0, **learner)


def _train_until(settings, n_steps: int, **kwargs):
    """run_learner until `n_steps` steps were taken (or 300 s); its result."""
    stop, steps = threading.Event(), []

    def on_step(step, metrics):
        steps.append(step)
        if len(steps) >= n_steps:
            stop.set()

    name = settings.learner.group_id
    return run_learner(settings, experiment=f"exp-{name}", model_name=f"m-{name}", stop=stop,
                       max_seconds=300, on_step=on_step, **kwargs)


def _finite(policy) -> bool:
    return all(bool(torch.isfinite(w).all()) for w in policy.trainable_state().values())


def _dlq_reasons(settings, n: int) -> list[dict]:
    return [read_dead_letter_headers(m.headers()) for m in _read_all(settings, settings.topics.dlq, n)]


@pytest.mark.integration
@pytest.mark.mlflow
def test_rewards_out_of_bounds_and_non_finite_logprobs_go_to_the_dlq(kafka_settings,
                                                                     mlflow_server,
                                                                     tiny_model_dir):
    settings = _settings(kafka_settings, mlflow_server, tiny_model_dir, batch_size=2)
    nan = float("nan")
    bad = [make_transition(0, ret=1e200), make_transition(1, ret=nan),
           {**make_transition(2, ret=1.0), "final_reward": float("-inf")},
           make_transition(3, ret=1.0, logprobs=[-0.5, nan, -0.5])]
    good = [make_transition(4, ret=1.0), make_transition(5, ret=0.0)]
    produce(settings, bad + good)
    result = _train_until(settings, 1)
    assert result.counters["dlq:reward_out_of_bounds"] == 3
    assert result.counters["dlq:non_finite_logprob"] == 1
    assert result.steps == 1 and sorted(result.ledger[0]) == sorted(t["transition_id"] for t in good)
    assert len(result.checkpoints) == 1 and _finite(result.policy)
    letters = _dlq_reasons(settings, 4)
    assert any("1e+200" in letter["detail"] and "rewards.max_abs" in letter["detail"]
               for letter in letters)


@pytest.mark.integration
@pytest.mark.mlflow
def test_a_step_whose_loss_is_not_finite_is_skipped_and_its_transitions_dead_lettered(
        kafka_settings, mlflow_server, tiny_model_dir):
    settings = _settings(kafka_settings, mlflow_server, tiny_model_dir, batch_size=2)
    # Behaviour logprobs an engine could never have meant: the importance ratio of the
    # negative-advantage response is infinite, and so is TRL's loss.
    absurd = [make_transition(i, ret=float(i), logprobs=[-1e30] * 3) for i in range(2)]
    fine = [make_transition(i + 2, ret=float(i)) for i in range(2)]
    produce(settings, absurd + fine)
    result = _train_until(settings, 1)
    assert result.counters["dlq:non_finite_loss"] == 2
    assert result.ledger == [[t["transition_id"] for t in fine]]
    assert len(result.checkpoints) == 1 and _finite(result.policy)
    letters = _dlq_reasons(settings, 2)
    assert [letter["reason"] for letter in letters] == ["non_finite_loss"] * 2
    assert sorted(letter["offset"] for letter in letters) == [0, 1]


@pytest.mark.integration
@pytest.mark.mlflow
def test_a_policy_scoring_non_finite_on_the_probe_set_is_never_registered(kafka_settings,
                                                                          mlflow_server,
                                                                          tiny_model_dir):
    # A learning rate no operator means: one step (finite loss and gradient) breaks the weights.
    settings = _settings(kafka_settings, mlflow_server, tiny_model_dir, batch_size=2, lr=1e38)
    produce(settings, [make_transition(i, ret=float(i % 2)) for i in range(4)])
    result = _train_until(settings, 2)
    store = CheckpointStore(settings, f"exp-{settings.learner.group_id}",
                            f"m-{settings.learner.group_id}")
    assert result.steps == 2 and result.checkpoints == [] and store.versions() == []
    assert result.counters["dlq:non_finite_probe"] == 4 and result.ledger == []
    assert _finite(result.policy)  # back to the base model, not left broken
    assert {letter["reason"] for letter in _dlq_reasons(settings, 4)} == {"non_finite_probe"}


class _Shell:
    """Unpickling this runs a shell command: what a tampered checkpoint could hold."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_checkpoint_state_is_read_without_unpickling_anything(tiny_model_dir, tmp_path):
    settings = learner_settings(load_settings(home=tmp_path), tiny_model_dir)
    policy = PolicyTrainer(settings, tmp_path / "work")
    extra = {"offsets": {"t:0": 3}, "ledger": [["a", "b"]], "dedupe": {"ids": ["a"],
                                                                      "emitted_ns": [5],
                                                                      "horizon_ns": 0}}
    policy.save(tmp_path / "ckpt", extra)
    expected = torch.rand(3)  # the RNG state after the save is what a load gives back
    assert policy.load(tmp_path / "ckpt") == extra and torch.equal(torch.rand(3), expected)

    marker = tmp_path / "ran"
    state = torch.load(tmp_path / "ckpt" / "trainer_state.pt", weights_only=False)
    state["extra"]["offsets"] = _Shell(f"touch {marker}")
    torch.save(state, tmp_path / "ckpt" / "trainer_state.pt")
    with pytest.raises(LearnerError, match="unpickling"):
        policy.load(tmp_path / "ckpt")
    assert not marker.exists(), "loading the checkpoint ran the command in it"


def test_checkpoints_of_before_keep_loading(tiny_model_dir, tmp_path):
    """Written before the numpy RNG state was stored as plain values: read with the allowlist
    of numpy's array types (data, nothing callable)."""
    import numpy as np

    settings = learner_settings(load_settings(home=tmp_path), tiny_model_dir)
    policy = PolicyTrainer(settings, tmp_path / "work")
    policy.save(tmp_path / "ckpt", {})
    state = torch.load(tmp_path / "ckpt" / "trainer_state.pt", weights_only=True)
    state["rng"]["numpy"] = np.random.get_state()
    expected = np.random.rand(3)
    torch.save(state, tmp_path / "ckpt" / "trainer_state.pt")
    policy.load(tmp_path / "ckpt")
    assert np.array_equal(np.random.rand(3), expected)
