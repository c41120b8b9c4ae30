"""Rehearsal: demonstrations trained in every traffic step beside it (learner/rehearsal.py);
the loop's part against the real broker and MLflow, with a tiny real model."""

from __future__ import annotations

import json

import pytest
from test_learner_guards import _dlq_reasons, _settings, _train_until
from test_learner_warm_start import _completion_logprob, _write
from transformers import AutoModelForCausalLM, AutoTokenizer

from learner.loop import run_learner
from learner.rehearsal import Rehearsal
from testkit.learner import learner_settings, make_transition, produce

DEMOS = [{"prompt": [{"role": "user", "content": f"Which colour is box {i}?"}],
          "completion": [{"role": "assistant", "content": f"Box {i} is teal."}]}
         for i in range(6)]


def test_every_demonstration_comes_once_a_pass_in_a_seeded_order_that_resumes(
        tmp_path, tiny_model_dir):
    path = tmp_path / "demos.jsonl"
    _write(path, DEMOS)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rehearsal = Rehearsal(path, 4, tokenizer, "sft", seed=3)
    taken = [t["transition_id"] for _ in range(3) for t in rehearsal.take()]
    assert len(taken) == 12 and all(tid.startswith("rehearse:") for tid in taken)
    first, second = taken[:6], taken[6:]
    assert len(set(first)) == 6 and sorted(first) == sorted(second) and first != second
    # the same seed gives the same rows; another seed another order
    again = Rehearsal(path, 4, tokenizer, "sft", seed=3)
    assert [t["transition_id"] for _ in range(3) for t in again.take()] == taken
    other = Rehearsal(path, 4, tokenizer, "sft", seed=4)
    assert [t["transition_id"] for t in other.take()] != taken[:4]
    # a rehearsal resumed from a checkpoint's state goes on where the first one stopped
    stopped = Rehearsal(path, 4, tokenizer, "sft", seed=3)
    stopped.take()
    resumed = Rehearsal(path, 4, tokenizer, "sft", seed=3)
    resumed.load_state_dict(json.loads(json.dumps(stopped.state_dict())))  # as checkpoints keep it
    assert [t["transition_id"] for t in resumed.take()] == taken[4:8]
    # rows are copies: the loop's marks on one never reach the next pass's
    row = rehearsal.take()[0]
    row["_weight"] = 0.5
    assert all("_weight" not in r for r in rehearsal.rows)


@pytest.mark.integration
@pytest.mark.mlflow
def test_sft_traffic_steps_learn_the_demonstrations_and_resume_their_order(
        tmp_path, kafka_settings, mlflow_server, tiny_model_dir):
    """Traffic that all failed gives `sft` nothing to imitate: the steps still learn the
    rehearsal's demonstrations, the figures stay the traffic's, and a restart takes the next
    demonstrations, not the first ones again."""
    path = tmp_path / "demos.jsonl"
    _write(path, DEMOS)
    base = kafka_settings.model_copy(update={"mlflow": mlflow_server})
    settings = learner_settings(base, tiny_model_dir, mode="sft", batch_size=2, lr=1e-2,
                                full_finetune=True, advantage="batch", checkpoint_every_steps=1,
                                batch_timeout_s=2.0, rehearsal=path, rehearsal_per_step=2)
    model = f"rehearse-{settings.learner.group_id}"
    traffic = [make_transition(i, ret=0.0) for i in range(6)]
    produce(settings, traffic[:4])
    seen = []
    first = run_learner(settings, experiment="rehearse", model_name=model, until_step=2,
                        max_seconds=240, on_step=lambda step, m: seen.append(m))
    expected = Rehearsal(path, 2, first.policy.tokenizer, "sft", settings.learner.seed)
    order = [[t["transition_id"] for t in expected.take()] for _ in range(3)]
    assert [sorted(ids) for ids in first.ledger] == [
        sorted([traffic[0]["transition_id"], traffic[1]["transition_id"], *order[0]]),
        sorted([traffic[2]["transition_id"], traffic[3]["transition_id"], *order[1]])]
    assert [m["mean_reward"] for m in seen] == [0.0, 0.0]
    assert [m["rehearsed"] for m in seen] == [2.0, 2.0]
    assert all(m["sft_examples"] == 2.0 for m in seen)  # the demonstrations, none of the traffic

    base_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    first.policy.model.eval()
    trained = {tid for ids in order[:2] for tid in ids}
    rows = {t["transition_id"]: t for t in expected.rows}
    for tid in trained:
        learnt = _completion_logprob(first.policy.model, rows[tid])
        before = _completion_logprob(base_model, rows[tid])
        assert learnt > before + 2.0, (tid, learnt, before)

    produce(settings, traffic[4:])
    second = run_learner(settings, experiment="rehearse", model_name=model, until_step=3,
                         max_seconds=240)
    assert second.resumed_from == 2
    assert sorted(second.ledger[-1]) == sorted([traffic[4]["transition_id"],
                                                traffic[5]["transition_id"], *order[2]])


@pytest.mark.integration
@pytest.mark.mlflow
def test_a_failed_step_sends_only_its_traffic_to_the_dlq(tmp_path, kafka_settings,
                                                        mlflow_server, tiny_model_dir):
    path = tmp_path / "demos.jsonl"
    _write(path, DEMOS)
    base = kafka_settings.model_copy(update={"mlflow": mlflow_server})
    settings = learner_settings(base, tiny_model_dir, mode="rl", batch_size=2,
                                advantage="batch", checkpoint_every_steps=1, batch_timeout_s=2.0,
                                rehearsal=path, rehearsal_per_step=2)
    # behaviour logprobs no engine could mean: the step's loss is infinite (test_learner_guards)
    absurd = [make_transition(i, ret=float(i), logprobs=[-1e30] * 3) for i in range(2)]
    fine = [make_transition(i + 2, ret=float(i)) for i in range(2)]
    produce(settings, absurd + fine)
    name = settings.learner.group_id
    result = run_learner(settings, experiment=f"exp-{name}", model_name=f"m-{name}",
                         until_step=1, max_seconds=240)
    assert result.counters["dlq:non_finite_loss"] == 2
    # the skipped step's demonstrations were not trained: the next step takes them
    expected = Rehearsal(path, 2, result.policy.tokenizer, "rl", settings.learner.seed)
    first = [t["transition_id"] for t in expected.take()]
    assert len(result.ledger) == 1
    assert sorted(tid for tid in result.ledger[0] if tid.startswith("rehearse:")) == sorted(first)
    letters = _dlq_reasons(settings, 2)
    assert sorted(letter["offset"] for letter in letters) == [0, 1]


@pytest.mark.integration
@pytest.mark.mlflow
def test_a_policy_the_probe_rejects_takes_its_rehearsal_rows_again(
        tmp_path, kafka_settings, mlflow_server, tiny_model_dir, monkeypatch):
    """Every step breaks the weights (a learning rate no operator means) and is rejected: the
    policy goes back to the base model, and the rehearsal to its first rows, so the next step
    trains the rejected step's demonstrations again rather than skipping them."""
    path = tmp_path / "demos.jsonl"
    _write(path, DEMOS)
    settings = _settings(kafka_settings, mlflow_server, tiny_model_dir, batch_size=2, lr=1e38,
                         rehearsal=path, rehearsal_per_step=2)
    handed_out = []
    take = Rehearsal.take

    def spy(self):  # the real rows, recorded: the ledger of rejected steps is dropped
        rows = take(self)
        handed_out.append([t["transition_id"] for t in rows])
        return rows

    monkeypatch.setattr(Rehearsal, "take", spy)
    produce(settings, [make_transition(i, ret=float(i % 2)) for i in range(4)])
    result = _train_until(settings, 2)
    assert result.steps == 2 and result.checkpoints == []
    assert result.counters["dlq:non_finite_probe"] == 4
    expected = Rehearsal(path, 2, result.policy.tokenizer, settings.learner.mode,
                         settings.learner.seed)
    first = [t["transition_id"] for t in take(expected)]
    assert handed_out == [first, first]
