"""The `sft` and `kto` modes: TRL's SFTTrainer and KTOTrainer losses on our stored token ids.

    TRACETRAIN_LEARNER__MODE=sft tracetrain learner      # or kto

TRL entry points used, and why: each trainer is built ONCE with a tiny pre-tokenized dummy
dataset (never `train()`, which would rebuild its scheduler per call), then per micro-batch
- `sft`: `trainer.data_collator` on `{"input_ids", "labels"}` (exact stored prompt + response
  ids, the prompt's labels -100: completion-only loss) and `SFTTrainer.compute_loss`, on the
  transitions whose credited return is at least
  `sft_min_reward` (a batch with none is skipped); where the rows begin with the same tokens
  (a calc batch's system prompt), `learner/shared_prefix.py` computes the same loss with
  that prefix run once (`learner.share_prefix`; metric `shared_prefix_tokens`);
- `kto`: `trainer.data_collator` on `{"prompt_ids", "completion_ids", "KL_completion_ids",
  "label"}` with label = advantage > 0 and KL completions cycled within the batch (what
  KTOTrainer's own dataset preparation does), then `KTOTrainer.compute_loss` (reference = the
  model with the adapter disabled, as TRL does for PEFT).
On CPU both read their log-probs through `learner/lm_head.py` (TRL's outputs, computed on the
labelled positions only).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from learner import lm_head, shared_prefix
from learner.errors import LearnerError
from learner.policy_loss import response_tool_mask
from tracetrain.settings.learner import LearnerSettings


def _common(learner: LearnerSettings, work_dir: Path) -> dict:
    return dict(
        output_dir=str(work_dir), learning_rate=learner.lr, lr_scheduler_type="constant",
        max_grad_norm=learner.max_grad_norm, gradient_checkpointing=False, bf16=False,
        use_cpu=not torch.cuda.is_available(), report_to=[], save_strategy="no",
        seed=learner.seed, per_device_train_batch_size=2,
    )


def build(mode: str, model, tokenizer, learner: LearnerSettings, work_dir: Path, peft_config):
    from datasets import Dataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "sft":
            from trl import SFTConfig, SFTTrainer

            args = SFTConfig(**_common(learner, work_dir), max_length=learner.max_length,
                             completion_only_loss=True, packing=False)
            dummy = Dataset.from_dict({"input_ids": [[1, 2, 3]] * 2,
                                       "completion_mask": [[0, 1, 1]] * 2})
            trainer = SFTTrainer(model=model, args=args, train_dataset=dummy,
                                 processing_class=tokenizer, peft_config=peft_config)
            lm_head.install(trainer.model, outputs=("entropy", "is_top1"))  # its metrics
            return trainer
        from trl import KTOConfig, KTOTrainer

        args = KTOConfig(**_common(learner, work_dir), max_length=learner.max_length,
                         beta=max(learner.beta, 0.1))
        dummy = Dataset.from_dict({"prompt": ["a", "b"], "completion": [" c", " d"],
                                   "label": [True, False]})
        trainer = KTOTrainer(model=model, args=args, train_dataset=dummy,
                             processing_class=tokenizer, peft_config=peft_config)
    lm_head.install(trainer.model, outputs=("entropy", "mean_logits"))  # its metrics
    return trainer


def loss(policy, transitions: list[dict], advantages: list[float], inputs: dict):
    trainer = policy.trl
    cut = policy.learner.max_length
    if policy.learner.mode == "sft":
        keep = [t for t in transitions if t["credited_return"] >= policy.learner.sft_min_reward]
        if not keep:
            return None, {}
        examples = imitation_examples(keep, cut)
        # The rows' shared prefix (a calc batch's system prompt) run once: the same loss.
        found = (shared_prefix.imitation_loss(policy.model, examples)
                 if policy.learner.share_prefix else None)
        if found is not None:
            value, shared = found
        else:
            batch = trainer.data_collator(examples)
            value, shared = trainer.compute_loss(policy.model, _to(batch, policy.device)), 0
        return value, {"sft_examples": float(len(keep)), "shared_prefix_tokens": float(shared)}
    if policy.learner.mode == "kto":
        if len(transitions) < 2:
            return None, {}  # KTO's KL estimate needs at least two completions
        responses = [t["response_token_ids"][:cut] for t in transitions]
        cycled = [responses[-1], *responses[:-1]]
        examples = [{"prompt_ids": t["prompt_token_ids"][-max(1, cut - len(r)):],
                     "completion_ids": r, "KL_completion_ids": kl, "label": a > 0}
                    for t, r, kl, a in zip(transitions, responses, cycled, advantages,
                                           strict=True)]
        batch = trainer.data_collator(examples)
        value = trainer.compute_loss(policy.model, _to(batch, policy.device))
        return value, {"desirable": float(sum(a > 0 for a in advantages))}
    raise LearnerError(f"mode {policy.learner.mode!r} has no offline loss")


def imitation_examples(transitions: list[dict], cut: int) -> list[dict]:
    """TRL's collator's rows for imitating `transitions`: `{"input_ids", "labels"}`, the
    sequence cut to `cut` tokens from the response's end."""
    examples = []
    for t in transitions:
        response = t["response_token_ids"][:cut]
        prompt = t["prompt_token_ids"][-max(1, cut - len(response)):]
        # Labels of -100 are not trained: the prompt, and the tool results between a warm
        # start's chained calls. Given as labels: TRL 1.x's collator no longer reads a
        # `completion_mask` (it folds it into labels when it prepares a dataset, which we
        # never use), and without labels it trained the prompt's tokens too.
        trained = response_tool_mask(t, response)
        examples.append({"input_ids": prompt + response,
                         "labels": [-100] * len(prompt) + [
                             token if keep else -100
                             for token, keep in zip(response, trained, strict=True)]})
    return examples


def shared_imitation(policy, transitions: list[dict]):
    """(loss, metrics) of imitating every one of `transitions` with their shared prefix run
    once, in any mode (`rl`'s warm start: trainer.py `train_step(imitate=True)`); None where
    learner/shared_prefix.py declines the batch or `learner.share_prefix` is off."""
    if not policy.learner.share_prefix:
        return None
    found = shared_prefix.imitation_loss(
        policy.model, imitation_examples(transitions, policy.learner.max_length))
    if found is None:
        return None
    value, shared = found
    return value, {"imitated": float(len(transitions)), "shared_prefix_tokens": float(shared)}


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}


def scorer(policy):
    raise LearnerError("response log-prob scoring is implemented for the rl mode only")
