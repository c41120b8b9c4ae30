"""The `sft` loss with the rows' shared prefix run once (learner/shared_prefix.py) is TRL's
loss: the same value, the same gradient, the same step, on calc warm-start rows (a long
shared system prompt and worked exchange, tool results masked inside the response)."""

from __future__ import annotations

import pytest
import torch
from test_learner_warm_start import _write

from demo.tasks import get_task
from learner import offline_modes, shared_prefix, warm_start
from learner.trainer import PolicyTrainer
from testkit.learner import learner_settings, make_transition
from tracetrain.settings import load_settings
from tracetrain.settings.learner import LORA_ALL_LINEAR


def _policy(tiny_model_dir, tmp_path, **learner) -> PolicyTrainer:
    settings = learner_settings(load_settings(home=tmp_path), tiny_model_dir, mode="sft",
                                lr=1e-2, batch_size=6, lora_targets=list(LORA_ALL_LINEAR),
                                **learner)
    return PolicyTrainer(settings, tmp_path / "work")


def _calc_rows(tmp_path, tokenizer, n: int = 6) -> list[dict]:
    path = tmp_path / "demos.jsonl"
    _write(path, get_task("calc").demonstrations(n, seed=5))
    rows = warm_start.transitions(path, tokenizer)
    assert len(rows) == n
    # a tool result inside each response: masked, with trained tokens on both sides
    assert all(0 in r["tool_mask"] and r["tool_mask"][-1] == 1 for r in rows)
    return rows


def _common_prefix(sequences: list[list[int]]) -> int:
    length = 0
    while all(len(s) > length and s[length] == sequences[0][length] for s in sequences):
        length += 1
    return length


def _loss_and_gradient(policy, rows, share: bool) -> tuple[torch.Tensor, dict, torch.Tensor]:
    policy.learner = policy.learner.model_copy(update={"share_prefix": share})
    ones = [1.0] * len(rows)
    loss, metrics = offline_modes.loss(policy, rows, ones, policy.inputs(rows, ones, ones))
    loss.backward()
    gradient = torch.cat([p.grad.flatten() for p in policy.params])
    policy.optimizer.zero_grad(set_to_none=True)
    return loss.detach(), metrics, gradient


@pytest.mark.parametrize("full_finetune", [False, True], ids=["lora", "full"])
def test_the_shared_prefix_loss_and_gradient_are_trls(tmp_path, tiny_model_dir, full_finetune):
    policy = _policy(tiny_model_dir, tmp_path, full_finetune=full_finetune)
    if not full_finetune:  # a non-zero B: the adapter changes the forward, A gets a gradient
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    policy.model.train()  # as train_step has it
    rows = _calc_rows(tmp_path, policy.tokenizer)

    shared_loss, shared, shared_grad = _loss_and_gradient(policy, rows, share=True)
    trl_loss, trl, trl_grad = _loss_and_gradient(policy, rows, share=False)

    # the system prompt and worked exchange: the problems differ from their question on
    common = _common_prefix([r["prompt_token_ids"] for r in rows])
    assert common >= 100
    assert shared == {"sft_examples": len(rows), "shared_prefix_tokens": common}
    assert trl == {"sft_examples": len(rows), "shared_prefix_tokens": 0.0}
    assert abs(float(shared_loss) - float(trl_loss)) < 1e-5, (shared_loss, trl_loss)
    assert float(trl_grad.norm()) > 0
    difference = float((shared_grad - trl_grad).norm() / trl_grad.norm())
    assert difference < 1e-5, difference  # a position off by one gives 1.6e-4


def test_a_batch_without_a_long_shared_prefix_takes_trls_path(tmp_path, tiny_model_dir):
    policy = _policy(tiny_model_dir, tmp_path)
    policy.model.train()
    rows = [make_transition(i, ret=1.0) for i in range(3)]  # prompts differ at token 0
    examples = [{"input_ids": r["prompt_token_ids"] + r["response_token_ids"],
                 "labels": [-100] * 3 + r["response_token_ids"]} for r in rows]
    assert shared_prefix.prefix_length(examples) == 0
    assert shared_prefix.imitation_loss(policy.model, examples) is None
    ones = [1.0] * len(rows)
    loss, metrics = offline_modes.loss(policy, rows, ones, policy.inputs(rows, ones, ones))
    assert metrics == {"sft_examples": 3.0, "shared_prefix_tokens": 0.0}
    assert torch.isfinite(loss)
    # one calc row alone, and two that share less than MIN_SHARED tokens, fall back too
    calc = _calc_rows(tmp_path, policy.tokenizer, n=2)
    one = [{"input_ids": calc[0]["prompt_token_ids"] + calc[0]["response_token_ids"],
            "labels": [-100] * len(calc[0]["prompt_token_ids"]) + calc[0]["response_token_ids"]}]
    assert shared_prefix.imitation_loss(policy.model, one) is None
    short = [{"input_ids": list(range(10, 40)), "labels": [-100] * 8 + list(range(18, 40))},
             {"input_ids": list(range(10, 45)), "labels": [-100] * 20 + list(range(30, 45))}]
    assert shared_prefix.prefix_length(short) == 7 < shared_prefix.MIN_SHARED  # row 0's label
    assert shared_prefix.imitation_loss(policy.model, short) is None


def test_the_prefix_ends_before_the_first_labelled_token_and_the_last(tmp_path):
    same = list(range(100, 140))
    examples = [{"input_ids": same, "labels": [-100] * 30 + same[30:]},
                {"input_ids": same + [7, 8], "labels": [-100] * 25 + same[25:] + [7, 8]}]
    assert shared_prefix.prefix_length(examples) == 24  # row 1's first label is at 25
    unlabelled = [{"input_ids": same, "labels": [-100] * 40},
                  {"input_ids": same[:20] + [1] * 20, "labels": [-100] * 40}]
    assert shared_prefix.prefix_length(unlabelled) == 20
    whole = [{"input_ids": same, "labels": [-100] * 40}] * 2
    assert shared_prefix.prefix_length(whole) == 39  # each row keeps its last token


def test_the_sft_step_is_the_same_with_and_without_the_shared_prefix(tmp_path, tiny_model_dir):
    rows = None
    after = {}
    for share in (True, False):
        policy = _policy(tiny_model_dir, tmp_path / str(share), share_prefix=share)
        before = {k: v.clone() for k, v in policy.trainable_state().items()}
        rows = rows or _calc_rows(tmp_path, policy.tokenizer)
        ones = [1.0] * len(rows)
        metrics = [policy.train_step(rows, ones, ones) for _ in range(2)]
        assert metrics[-1]["shared_prefix_tokens"] == (
            _common_prefix([r["prompt_token_ids"] for r in rows]) if share else 0.0)
        after[share] = (policy.trainable_state(), [m["loss"] for m in metrics])
    (shared, shared_losses), (unshared, unshared_losses) = after[True], after[False]
    assert shared_losses == pytest.approx(unshared_losses, abs=1e-5)
    assert shared_losses[1] < shared_losses[0]  # it stepped
    assert shared.keys() == unshared.keys()
    # The steps compared as a whole: Adam divides each entry's gradient by its own size, so an
    # entry whose gradient is near zero moves by up to the learning rate either way on float
    # rounding alone (other threads, other kernels: CI saw one lora_B entry do so), while a
    # wrong loss moves them all (one entry flipped by twice the rate is about 0.005 here).
    moved = torch.cat([(shared[k] - before[k]).flatten() for k in shared])
    apart = torch.cat([(shared[k] - unshared[k]).flatten() for k in shared])
    assert float(moved.norm()) > 0 and float(apart.norm() / moved.norm()) < 3e-2  # measured 1e-6
    assert any(float(v.abs().sum()) > 0 for k, v in shared.items() if "lora_B" in k)


def _mean_labelled_logprob(model, examples: list[dict]) -> float:
    """Minus the mean log-prob of the labelled tokens, one plain forward a row: TRL's sft loss
    computed the long way, the reference for the shared-prefix path."""
    total, count = 0.0, 0
    with torch.no_grad():
        for e in examples:
            logits = model(input_ids=torch.tensor([e["input_ids"]])).logits[0].float()
            logps = logits[:-1].log_softmax(-1)
            for position, label in enumerate(e["labels"][1:]):
                if label != shared_prefix.IGNORED:
                    total, count = total + float(logps[position, label]), count + 1
    return -total / count


def test_rls_warm_start_imitates_with_the_shared_prefix_and_its_traffic_keeps_grpo(
        tmp_path, tiny_model_dir):
    """`rl`'s warm start steps (`imitate=True`) take the sft loss with the batch's prompt run
    once, which is what lets an rl demo warm start on as many worked problems as sft's; its
    traffic steps, and a batch the shared prefix does not take, keep the GRPO loss."""
    settings = learner_settings(load_settings(home=tmp_path), tiny_model_dir, mode="rl",
                                lr=1e-2, batch_size=6, lora_targets=list(LORA_ALL_LINEAR))
    policy = PolicyTrainer(settings, tmp_path / "work")
    rows = _calc_rows(tmp_path, policy.tokenizer)
    examples = offline_modes.imitation_examples(rows, policy.learner.max_length)
    ones = [1.0] * len(rows)
    policy.model.eval()
    want = _mean_labelled_logprob(policy.model, examples)

    first = policy.train_step(rows, ones, ones, imitate=True)
    assert first["shared_prefix_tokens"] == _common_prefix([r["prompt_token_ids"] for r in rows])
    assert first["imitated"] == len(rows)
    assert first["loss"] == pytest.approx(want, abs=1e-4)
    policy.model.eval()
    assert _mean_labelled_logprob(policy.model, examples) < want  # it stepped towards them

    # the same rows as traffic, and one row alone as a warm start: GRPO's loss
    for batch, imitate in ((rows, False), (rows[:1], True)):
        metrics = policy.train_step(batch, [1.0] * len(batch), [1.0] * len(batch),
                                    imitate=imitate)
        assert "shared_prefix_tokens" not in metrics and "imitated" not in metrics
        assert "clip_fraction" in metrics, metrics  # policy_loss.py's GRPO metrics
