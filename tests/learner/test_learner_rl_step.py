"""The `rl` step on TRL's GRPO loss moves a tiny real model the right way (no Kafka)."""

from __future__ import annotations

import pytest
import torch

from learner.advantages import BatchAdvantage
from learner.errors import LearnerError
from learner.trainer import PolicyTrainer
from testkit.learner import learner_settings, make_transition
from tracetrain.settings import load_settings


def test_rl_step_raises_good_and_lowers_bad_logprobs(tiny_model_dir, tmp_path):
    settings = learner_settings(load_settings(home=tmp_path), tiny_model_dir, lr=5e-3,
                                batch_size=4)
    policy = PolicyTrainer(settings, tmp_path / "work")
    good = [make_transition(i, ret=1.0, response=[410, 411, 412, 2]) for i in range(2)]
    bad = [make_transition(i + 2, ret=0.0, response=[610, 611, 612, 2]) for i in range(2)]
    batch = good + bad
    # Behaviour logprobs as an engine would have reported them: from the starting policy.
    for t, inputs_lp in zip(batch, _token_logps(policy, batch), strict=True):
        t["behaviour_logprobs"] = inputs_lp
    before = policy.response_logprob_sums(batch)
    advantages = BatchAdvantage().compute(batch)
    assert advantages[0] > 0 > advantages[2]
    for _ in range(4):
        metrics = policy.train_step(batch, advantages, [1.0] * 4)
    after = policy.response_logprob_sums(batch)
    assert policy.step == 4
    for i in range(2):
        assert after[i] > before[i] + 0.05, (before, after)
        assert after[i + 2] < before[i + 2] - 0.05, (before, after)
    assert metrics["grad_norm"] > 0 and metrics["tokens"] > 0


def _token_logps(policy, batch):
    from learner.policy_loss import response_logps

    inputs = policy.inputs(batch, [0.0] * len(batch), [1.0] * len(batch))
    logps = response_logps(policy.trl, policy.model, inputs)
    return [logps[i, : len(t["response_token_ids"])].tolist() for i, t in enumerate(batch)]


def test_the_lora_adapts_the_layers_lora_targets_names(tiny_model_dir, tmp_path):
    """`learner.lora_targets` reaches PEFT: every named layer of every block, and only those,
    gets an adapter, and one step moves the MLP's as well as attention's."""
    from tracetrain.settings.learner import LORA_ALL_LINEAR, LORA_ATTENTION

    for targets in (LORA_ATTENTION, LORA_ALL_LINEAR):
        settings = learner_settings(load_settings(home=tmp_path), tiny_model_dir, lr=5e-3,
                                    batch_size=2, mode="sft", lora_targets=list(targets))
        policy = PolicyTrainer(settings, tmp_path / f"work-{len(targets)}")
        trained = {name: p.detach().clone() for name, p in policy.model.named_parameters()
                   if p.requires_grad}
        adapted = {_layer(name) for name in trained}
        assert adapted == set(targets), adapted
        assert len(trained) == 2 * 2 * len(targets)  # A and B, 2 blocks of the tiny model
        batch = [make_transition(i, ret=1.0, response=[410, 411, 2]) for i in range(2)]
        for _ in range(2):  # B starts at zero: the second step moves A too
            policy.train_step(batch, [1.0, 1.0], [1.0, 1.0])
        moved = {_layer(name) for name, p in policy.model.named_parameters()
                 if name in trained and not torch.equal(p, trained[name])}
        assert moved == set(targets), moved
        policy.save(tmp_path / f"checkpoint-{len(targets)}", {})
    # a checkpoint is resumed only by a learner adapting the same layers
    again = PolicyTrainer(settings, tmp_path / "again")
    again.load(tmp_path / f"checkpoint-{len(LORA_ALL_LINEAR)}")
    other = learner_settings(load_settings(home=tmp_path), tiny_model_dir, mode="sft",
                             lora_targets=list(LORA_ATTENTION))
    with pytest.raises(LearnerError, match=r"adapts \['down_proj'.*learner.lora_targets is "
                                           r"\['q_proj', 'v_proj'\]"):
        PolicyTrainer(other, tmp_path / "other").load(tmp_path / "checkpoint-7")


def _layer(parameter: str) -> str:
    """`...layers.0.mlp.down_proj.lora_A.default.weight` -> `down_proj`."""
    return parameter.split(".lora_")[0].rsplit(".", 1)[-1]
