"""The `rl` step's loss: TRL's GRPO loss code, fed our stored batches.

    trainer = build_grpo_trainer(model, tokenizer, settings.learner, work_dir)
    loss, metrics = rl_loss(trainer, inputs_from(transitions, advantages, weights, ...))

TRL entry points used, and why:
- `trl.GRPOTrainer` is built ONCE with a one-row dummy dataset and a no-op reward function; we
  never call `train()` (it would generate completions itself and rebuild its scheduler on every
  call). Building it gets us TRL's model preparation: the PEFT wrapping from `peft_config`,
  dropout disabled, and the fused LM head that yields per-token log-probabilities.
- `GRPOTrainer._compute_loss(model, inputs)` is the loss: per-token log-probs of the stored
  response tokens, the (token-level) importance ratio against `old_per_token_logps` (our stored
  behaviour logprobs from the engine), two-sided PPO clipping with `epsilon`, the `loss_type`
  normalisation, and the KL term to `ref_per_token_logps` when `beta > 0`. It also records clip
  fractions, entropy and KL in `trainer._metrics`, which we read back per step.
- `GRPOTrainer._get_per_token_logps_and_entropies` scores the reference (the same model with
  the adapter disabled, exactly as TRL does for PEFT) and, in tests, response log-probs.
- `Trainer.create_optimizer_and_scheduler` builds the one long-lived AdamW + constant schedule.
On CPU the log-probs TRL asks for are computed by `learner/lm_head.py` (same outputs, one LM-head
projection of the response positions instead of TRL's tiled fallback over every position).
The inputs dict mirrors what `_generate_and_score_completions` hands to `_compute_loss`:
left-padded `prompt_ids`/`prompt_mask`, right-padded `completion_ids`/`completion_mask`,
`advantages` (B,), `old_per_token_logps` (B, T), `num_items_in_batch`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from learner import lm_head
from tracetrain.numbers import GREEDY_BELOW
from tracetrain.settings.learner import LearnerSettings


def build_grpo_trainer(model, tokenizer, learner: LearnerSettings, work_dir: Path, peft_config=None):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(work_dir),
        per_device_train_batch_size=2,
        num_generations=2,  # required >= 2 by GRPOConfig; unused, we never generate
        learning_rate=learner.lr,
        lr_scheduler_type="constant",
        beta=learner.beta,
        epsilon=learner.epsilon,
        loss_type=learner.loss_type,
        max_grad_norm=learner.max_grad_norm,
        max_completion_length=learner.max_length,
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=not torch.cuda.is_available(),
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=learner.seed,
        disable_dropout=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=_no_reward,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["unused"]}),
            processing_class=tokenizer,
            peft_config=peft_config,
        )
    trainer.current_gradient_accumulation_steps = 1  # one optimizer step per micro-batch
    # `_compute_loss` reads the entropy (metric; a gradient only for TRL's entropy bonus).
    lm_head.install(trainer.model, outputs=("entropy",), temperature=trainer.temperature,
                    entropy_requires_grad=trainer._entropy_bonus_enabled)
    return trainer


def _no_reward(completions, **_):
    return [0.0] * len(completions)


def scoring_temperature(transition: dict) -> float:
    """The temperature a transition is scored at: the engine's sampling temperature
    (Transition v2), 1.0 when unknown (v1, null). A greedy call (temperature 0) is scored at
    1.0, never divided by 0: greedy sampling has no distribution of its own to score, and both
    engines report a greedy call's logprobs under the unscaled distribution (the embedded
    engine reports raw-model logprobs below GREEDY_BELOW; vLLM's processed logprobs apply no
    temperature to greedy requests), so at 1.0 learner and behaviour logprobs are the same function and
    their ratio still measures the engine/learner mismatch."""
    value = transition.get("sampling_temperature")
    return 1.0 if value is None or value < GREEDY_BELOW else float(value)


def inputs_from(transitions: list[dict], advantages: list[float], weights: list[float],
                pad_id: int, max_length: int, device: torch.device) -> dict:
    """TRL's `_compute_loss` inputs from stored transitions; the prompt is cut from the left when
    prompt + response exceed `max_length` (the response tokens are what is trained). A
    transition with a `tool_mask` (a warm start's chained calls: 0 on the tool results between
    them) passes it on as TRL's `tool_mask`, which keeps those tokens out of the loss."""
    prompts, completions, logps, tools = [], [], [], []
    for t in transitions:
        response = t["response_token_ids"][:max_length]
        prompt = t["prompt_token_ids"][-max(1, max_length - len(response)):]
        prompts.append(prompt)
        completions.append(response)
        logps.append(t["behaviour_logprobs"][: len(response)] or None)
        tools.append(response_tool_mask(t, response))
    b = len(transitions)
    p_len = max(len(p) for p in prompts)
    c_len = max(len(c) for c in completions)
    prompt_ids = torch.full((b, p_len), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((b, p_len), dtype=torch.long)
    completion_ids = torch.full((b, c_len), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((b, c_len), dtype=torch.long)
    tool_mask = torch.ones((b, c_len), dtype=torch.long)
    old = torch.zeros((b, c_len), dtype=torch.float32)
    has_old = torch.zeros(b, dtype=torch.bool)
    for i, (p, c, lp, tm) in enumerate(zip(prompts, completions, logps, tools, strict=True)):
        prompt_ids[i, p_len - len(p):] = torch.tensor(p)
        prompt_mask[i, p_len - len(p):] = 1
        completion_ids[i, : len(c)] = torch.tensor(c)
        completion_mask[i, : len(c)] = 1
        tool_mask[i, : len(tm)] = torch.tensor(tm)
        if lp is not None:
            old[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
            has_old[i] = True
    # Staleness down-weighting scales the advantage: the gradient of that sample shrinks.
    adv = torch.tensor([a * w for a, w in zip(advantages, weights, strict=True)], dtype=torch.float32)
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": adv, "old_logps": old, "has_old": has_old,
        "temperatures": torch.tensor([scoring_temperature(t) for t in transitions],
                                     dtype=torch.float32),
        "num_items_in_batch": (completion_mask * tool_mask).sum().float(),
    }
    if not bool(tool_mask.all()):
        inputs["tool_mask"] = tool_mask
    return {k: v.to(device) for k, v in inputs.items()}


def response_tool_mask(transition: dict, response: list[int]) -> list[int]:
    """The transition's `tool_mask` over `response` (its response, maybe cut): 1 on the tokens
    the policy wrote, 0 on tool results between chained calls; all 1 without one."""
    return transition.get("tool_mask", [])[: len(response)] or [1] * len(response)


def trained_mask(inputs: dict) -> torch.Tensor:
    """The response tokens the loss trains (B, T): the completion's, less any tool results
    within it (`tool_mask`). `completion_mask` itself stays the attention mask: a chained
    call attends to the tool result it answers."""
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def response_logps(trainer, model, inputs: dict) -> torch.Tensor:
    """Per-token log-probs (B, T) of the completion tokens under `model` (no grad), each row at
    its transition's sampling temperature."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad(), lm_head.row_temperatures(model, inputs.get("temperatures")):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            model, ids, mask, inputs["completion_ids"].size(1))
    return logps


def truncated_is(learner_logps: torch.Tensor, behaviour_logps: torch.Tensor, mask: torch.Tensor,
                 cap: float, measured: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance sampling for the engine/learner mismatch (verl's rollout
    correction, token level): rho = exp(learner - behaviour) per token, truncated at `cap`.
    Returns the factor min(rho, cap) / rho (B, T) that multiplies each token's advantage: TRL's
    ratio is already learner/behaviour, so the factor turns its gradient rho * A * grad(logp)
    into min(rho, cap) * A * grad(logp), and PPO's clip still bounds the staleness. The metrics
    describe the `measured` tokens (default `mask`): those whose behaviour logprobs the engine
    reported; a row scored on-policy has rho 1 by construction and would pull them to 1."""
    rho = torch.exp(learner_logps - behaviour_logps)
    factor = torch.where(rho > cap, cap / rho, torch.ones_like(rho)) * mask
    measured = mask if measured is None else measured
    tokens = measured.sum().clamp(min=1)
    return factor, {
        "is_ratio_mean": float((rho * measured).sum() / tokens),
        "is_ratio_max": float(torch.where(measured.bool(), rho, torch.zeros_like(rho)).max()),
        "is_truncated_fraction": float(((rho > cap) & measured.bool()).sum() / tokens),
    }


def rl_loss(trainer, model, inputs: dict, tis_cap: float | None = None, forward=None,
            rescore: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's GRPO loss on one micro-batch, and the metrics TRL recorded for it; with `tis_cap`
    the tokens that carry behaviour logprobs are importance-weighted by `truncated_is`.

    A row without behaviour logprobs (a call the streams stage re-tokenised from an
    OpenTelemetry span: the engine's logprobs were never recorded, and would be of its own
    tokens anyway) is scored on-policy: its behaviour logprobs are the learner's own, detached,
    so its ratio is 1, PPO's clip never binds on it and no mismatch is corrected. That is also
    what scoring it would give when its policy_version is the learner's current one (the same
    weights); for an older version the learner no longer holds those weights, and the
    staleness bound (`max_staleness`, the batcher) is what limits how far off-policy it is.
    The clip and IS metrics describe the rows that carry the engine's logprobs only
    (`behaviour_token_fraction` says how many), so re-tokenised rows do not dilute them.
    `forward`: the module the loss's gradient flows through (`model` wrapped in DDP under
    torchrun); `model` itself for the scoring passes without gradient. `rescore`: always take
    the scoring pass (the same ratios: a row's old logps are its stored ones or its current
    ones either way). A sharded model (FSDP) needs it: each forward all-gathers the weights, so
    every rank must take the same passes, whichever behaviour logprobs its own rows carry."""
    trl_inputs = {k: inputs[k] for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                         "completion_mask", "advantages", "num_items_in_batch",
                                         "tool_mask") if k in inputs}
    has_old, trained = inputs["has_old"], trained_mask(inputs)
    behaved = trained * has_old.unsqueeze(1)
    correction: dict[str, float] = {}
    # With no stored behaviour logprobs at all the ratio is the on-policy 1: TRL does that
    # itself when `old_per_token_logps` is absent (detached current logps, no extra forward); a
    # batch mixing both, or truncated IS, needs the current logps.
    if bool(has_old.all()) and tis_cap is None and not rescore:
        trl_inputs["old_per_token_logps"] = inputs["old_logps"]
    elif bool(has_old.any()) or rescore:
        current = response_logps(trainer, model, inputs)
        old = torch.where(has_old.unsqueeze(1), inputs["old_logps"], current)
        trl_inputs["old_per_token_logps"] = old
        if tis_cap is not None:
            factor, correction = truncated_is(current, old, trained, tis_cap, behaved)
            trl_inputs["advantages"] = inputs["advantages"].unsqueeze(1) * factor
    if trainer.beta != 0.0:
        if hasattr(model, "disable_adapter"):
            with model.disable_adapter():
                trl_inputs["ref_per_token_logps"] = response_logps(trainer, model, inputs)
        else:
            trl_inputs["ref_per_token_logps"] = response_logps(trainer, trainer.ref_model, inputs)
    trainer._metrics["train"].clear()
    with lm_head.row_temperatures(model, inputs.get("temperatures")):
        loss = trainer._compute_loss(forward or model, trl_inputs)
    recorded = {k: v[-1] for k, v in trainer._metrics["train"].items() if v}
    tokens, behaved_tokens = float(trained.sum()), float(behaved.sum())
    # TRL's clip fraction is over every response token; an on-policy row (ratio 1) is never
    # clipped, so over the rows with behaviour logprobs it is the same count over fewer tokens.
    clipped = recorded.get("clip_ratio/region_mean", 0.0) * tokens
    metrics = {
        "clip_fraction": clipped / behaved_tokens if behaved_tokens else 0.0,
        "behaviour_token_fraction": behaved_tokens / tokens if tokens else 0.0,
        "entropy": recorded.get("entropy", 0.0),
        "kl": recorded.get("kl", 0.0),
        **correction,
    }
    return loss, metrics
