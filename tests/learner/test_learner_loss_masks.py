"""What the `sft` and `rl` losses train: the response's tokens, never the prompt's, nor a tool
result between a warm start's chained calls (TRL's `tool_mask`). Checked against the
log-likelihood computed by hand from the model's logits."""

from __future__ import annotations

import pytest
import torch

from learner import offline_modes
from learner.trainer import PolicyTrainer
from testkit.learner import learner_settings, make_transition
from tracetrain.settings import load_settings


def _transitions() -> list[dict]:
    """Two calls, the second with a 'tool result' (3 tokens) between two trained spans."""
    first = make_transition(0, ret=1.0, response=[410, 411, 412, 2])
    second = make_transition(1, ret=1.0, response=[510, 511, 700, 701, 702, 512, 2])
    second["tool_mask"] = [1, 1, 0, 0, 0, 1, 1]
    return [first, second]


def _token_logps(model, t: dict) -> torch.Tensor:
    """log p of each response token given everything before it, from the model's logits."""
    ids = torch.tensor([t["prompt_token_ids"] + t["response_token_ids"]])
    logps = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
    start = len(t["prompt_token_ids"]) - 1
    return logps[start:].gather(1, ids[0, start + 1:, None])[:, 0]


def _trained(t: dict) -> torch.Tensor:
    return torch.tensor(t.get("tool_mask") or [1] * len(t["response_token_ids"]),
                        dtype=torch.float32)


@pytest.fixture
def policy(request, tiny_model_dir, tmp_path):
    settings = learner_settings(load_settings(home=tmp_path), tiny_model_dir, lr=1e-3,
                                batch_size=2, mode=request.param, full_finetune=True)
    trainer = PolicyTrainer(settings, tmp_path / "work")
    trainer.model.eval()  # no dropout: the hand computation and the loss see the same model
    return trainer


def _gradient(policy, loss: torch.Tensor) -> list[torch.Tensor]:
    loss.backward()
    grads = [p.grad.detach().clone() for p in policy.params]
    policy.optimizer.zero_grad(set_to_none=True)
    return grads


def _assert_same(ours: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for got, want in zip(ours, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-7)
    assert max(float(g.abs().max()) for g in expected) > 0


@pytest.mark.parametrize("policy", ["sft"], indirect=True)
def test_sft_loss_is_the_mean_nll_of_the_trained_tokens_only(policy):
    """TRL's SFT loss is the mean NLL over the batch's trained tokens: its value and its
    gradient must be that one's (the prompt's tokens and a tool result's are not trained)."""
    batch = _transitions()
    inputs = policy.inputs(batch, [1.0, 1.0], [1.0, 1.0])
    loss, _ = offline_modes.loss(policy, batch, [1.0, 1.0], inputs)
    masks = [_trained(t) for t in batch]
    by_hand = -sum((_token_logps(policy.model, t) * m).sum() for t, m in zip(
        batch, masks, strict=True)) / sum(m.sum() for m in masks)
    assert float(loss.detach()) == pytest.approx(float(by_hand.detach()), rel=1e-4)
    _assert_same(_gradient(policy, loss), _gradient(policy, by_hand))


@pytest.mark.parametrize("policy", ["rl"], indirect=True)
def test_rl_gradient_is_that_of_the_trained_tokens_only(policy):
    """At ratio 1 and advantage 1, TRL's `grpo` loss is minus the mean over rows of each row's
    mean log-prob over its trained tokens: its gradient must be that one's."""
    batch = _transitions()
    inputs = policy.inputs(batch, [1.0, 1.0], [1.0, 1.0])
    assert inputs["tool_mask"].tolist()[1] == batch[1]["tool_mask"]
    assert float(inputs["num_items_in_batch"]) == 4 + 4
    policy._accumulated_loss(inputs, 1.0, policy.model)  # its backward is taken
    ours = [p.grad.detach().clone() for p in policy.params]
    policy.optimizer.zero_grad(set_to_none=True)
    by_hand = -torch.stack([(_token_logps(policy.model, t) * _trained(t)).sum()
                            / _trained(t).sum() for t in batch]).mean()
    _assert_same(ours, _gradient(policy, by_hand))
