"""CPU scoring for TRL's fused LM head: one projection of the labelled positions, no tiles.

    trainer = GRPOTrainer(...)                  # TRL patches the model's forward here
    lm_head.install(trainer.model, outputs=("entropy",), temperature=trainer.temperature)

TRL 1.16 patches each model it trains (`trl.trainer.utils.add_fused_lm_head`) so that its
losses call `model(..., labels=labels, fused_lm_head=True)` and get per-token log-probs (and
entropy, top-1) without materialising (batch, seq, vocab) logits. On CUDA a Triton kernel
scores only the labelled positions. Elsewhere it falls back to torch ops that score EVERY
position (prompt and padding too: fixed tile shapes for compilers), fold each
(positions x 32768) tile in a dozen elementwise passes, and project all positions through the
LM head a second time in backward. On two CPU cores that made our `rl` step 0.74x a bare PEFT
step (bench.learner), the LM head being a fifth of SmolLM2-135M's weights.

`install` keeps TRL's forward for every other call and, when the LM head is on the CPU,
gathers the labelled positions first and projects them once; `log_softmax` and its autograd
do the rest. The cost is labelled positions x vocab floats (256 x 49152 x 4 B = 50 MB for the
default batch), the memory TRL's tiling saves on a GPU and a CPU learner has to spare. The
result keeps TRL's `FusedCausalLMOutput` contract: per-token fields are zero where the label is
-100 and `loss` is -sum(log_probs) / num_items_in_batch.
"""

from __future__ import annotations

import contextlib
import types

import torch

from learner.errors import LearnerError

# Config fields that change the logits after the projection; TRL's forward handles them, so a
# model with any of them keeps it.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier",
                     "lm_head_multiplier", "logits_scaling")
SUPPORTED_OUTPUTS = ("entropy", "is_top1", "mean_logits")


def install(model, outputs: tuple[str, ...] = (), temperature: float = 1.0,
            entropy_requires_grad: bool = False) -> bool:
    """Route `fused_lm_head=True` calls of `model` (a PEFT wrapper or the model TRL patched)
    through the compact CPU path. `outputs`: the optional per-token fields the trainer reads,
    of `SUPPORTED_OUTPUTS`. Returns False (and changes nothing) where TRL's path must stay."""
    unknown = set(outputs) - set(SUPPORTED_OUTPUTS)
    if unknown:
        raise LearnerError(f"lm_head outputs {sorted(unknown)}: expected some of {SUPPORTED_OUTPUTS}")
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    text_config = target.config.get_text_config()
    if any(getattr(text_config, name, None) is not None for name in LOGIT_TRANSFORMS):
        return False
    if "forward" not in vars(target):
        raise LearnerError(f"{type(target).__name__} has no fused LM head yet: install after the "
                         "TRL trainer is built (building it patches the model's forward)")
    trl_forward = target.forward

    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None,
                num_items_in_batch=None, **kwargs):
        head = self.get_output_embeddings()
        if (not fused_lm_head or shift_labels is not None or head.weight.device.type != "cpu"
                or kwargs.get("output_router_logits")
                or getattr(text_config, "output_router_logits", False)):
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels,
                               shift_labels=shift_labels, num_items_in_batch=num_items_in_batch,
                               **kwargs)
        return _score(self, head, args, kwargs, labels, num_items_in_batch, outputs,
                      temperature, entropy_requires_grad)

    target.forward = types.MethodType(forward, target)
    return True


@contextlib.contextmanager
def row_temperatures(model, temperatures: torch.Tensor | None):
    """Score each row of the calls inside at its own sampling temperature (B,), the
    distribution the engine sampled that row from. Only the compact CPU path knows rows; a
    model on TRL's path (a GPU head) is refused unless every temperature is 1."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    if temperatures is not None and bool((temperatures == 1.0).all()):
        temperatures = None
    if temperatures is not None and target.get_output_embeddings().weight.device.type != "cpu":
        raise LearnerError("per-transition sampling temperatures are scored on the CPU LM head "
                           "only; got a head on " + str(target.get_output_embeddings().weight.device))
    target._row_temperatures = temperatures
    try:
        yield
    finally:
        target._row_temperatures = None


def _score(model, head, args, kwargs, labels, num_items_in_batch, outputs, temperature,
           entropy_requires_grad):
    from trl.trainer.utils import FusedCausalLMOutput

    kwargs["use_cache"] = False
    hidden = model.base_model(*args, **kwargs).last_hidden_state[:, :-1]
    labels = labels[:, 1:]
    mask = labels != -100
    targets = labels[mask]
    logits = head(hidden[mask]).float()
    rows = getattr(model, "_row_temperatures", None)
    if rows is not None:
        logits = logits / rows.unsqueeze(1).expand(mask.shape)[mask].unsqueeze(-1)
    elif temperature != 1.0:
        logits = logits / temperature
    logp = logits.log_softmax(-1)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    def spread(values: torch.Tensor) -> torch.Tensor:
        # masked_scatter keeps an all-masked batch connected to the graph (a zero gradient).
        return values.new_zeros(mask.shape).masked_scatter(mask, values)

    entropy = is_top1 = mean_logits = None
    if "entropy" in outputs:
        with torch.set_grad_enabled(entropy_requires_grad and torch.is_grad_enabled()):
            entropy = spread(-(logp.exp() * logp).sum(-1))
    if "is_top1" in outputs:
        with torch.no_grad():
            top1 = logits.argmax(-1) == targets
        is_top1 = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)
        is_top1[mask] = top1
    if "mean_logits" in outputs:
        with torch.no_grad():
            mean_logits = spread(logits.mean(-1))
    log_probs = spread(picked)
    denominator = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(loss=-log_probs.sum() / denominator, log_probs=log_probs,
                               entropy=entropy, is_top1=is_top1, mean_logits=mean_logits,
                               label_mask=mask)
