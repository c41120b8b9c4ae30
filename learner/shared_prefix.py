"""The `sft` loss with the prefix every row of the micro-batch shares run once.

    found = shared_prefix.imitation_loss(model, examples)   # None: take TRL's path instead
    loss, shared_tokens = found

`examples` are what `offline_modes.loss` hands TRL's collator: `{"input_ids", "labels"}` per
row, the labels -100 on the prompt and on tool results. Every row of a calc batch begins with
the same ~140 tokens (the system prompt and a worked exchange) of its ~200, so TRL's forward
spends most of the step on that prefix, once per row. Here the rows' longest common prefix
(`prefix_length`) goes through the decoder once (batch 1, with gradient) into a KV cache,
whose tensors `DynamicCache.batch_repeat_interleave` repeats per row (new tensors: autograd
sums the rows' gradients back into the one prefix pass); the rows' suffixes, right-padded,
then attend to it at positions L, L+1, ...; the LM head projects only the positions whose
next token is labelled. The loss is TRL's (`SFTTrainer.compute_loss`): minus the mean
log-prob of the batch's labelled tokens; measured against it, loss and gradient agree to
float rounding (tests/learner/test_learner_shared_prefix.py).

None, and TRL's path, where the result would not be TRL's or the saving is small: one row,
a shared prefix under `MIN_SHARED` tokens, no labelled token, or a model this does not
know how to split into decoder and head: a PEFT method other than injected layers (prompt
learning adds virtual tokens in PeftModel's own forward), logits transformed after the head,
router logits (MoE aux loss), a cache layer other than plain full attention (sliding
windows, linear attention), gradient checkpointing (which turns the cache off), or dropout
in training (the rows would share the prefix's dropout mask).
"""

from __future__ import annotations

import torch

from learner import lm_head

# Below this many shared tokens the saving does not pay for the second forward call.
MIN_SHARED = 16
IGNORED = -100  # TRL's (and torch's) label of a token not trained


def prefix_length(examples: list[dict]) -> int:
    """The tokens every row begins with that the suffix pass need not see: the rows' longest
    common prefix, ending before each row's first labelled token's position minus one (that
    token is scored from the hidden state just before it, which the suffix pass computes)
    and before each row's last token (every row keeps at least one)."""
    rows = [e["input_ids"] for e in examples]
    limit = min(len(row) for row in rows) - 1
    for e in examples:
        first = next((t for t, label in enumerate(e["labels"]) if label != IGNORED), None)
        if first is not None:
            limit = min(limit, first - 1)
    length = 0
    while length < limit and all(row[length] == rows[0][length] for row in rows):
        length += 1
    return length


def imitation_loss(model, examples: list[dict]) -> tuple[torch.Tensor, int] | None:
    """Minus the mean log-prob of the labelled tokens of `examples` under `model` (a PEFT
    LoRA wrapper or a bare causal LM), their shared prefix run once, and that prefix's length;
    None where TRL's path must take the batch (the module's docstring says when)."""
    if len(examples) < 2 or not any(label != IGNORED for e in examples
                                    for label in e["labels"][1:]):
        return None
    length = prefix_length(examples)
    if length < MIN_SHARED:
        return None
    parts = _decoder_and_head(model)
    if parts is None:
        return None
    config, decoder, head = parts
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    if not all(type(layer) is DynamicLayer for layer in cache.layers):
        return None
    device = head.weight.device
    rows = len(examples)
    decoder(input_ids=torch.tensor([examples[0]["input_ids"][:length]], device=device),
            past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(rows)

    suffixes = [e["input_ids"][length:] for e in examples]
    width = max(len(s) for s in suffixes)
    ids = torch.zeros((rows, width), dtype=torch.long)  # the padding is masked: any id does
    mask = torch.zeros((rows, length + width), dtype=torch.long)
    mask[:, :length] = 1
    labels = torch.full((rows, width), IGNORED, dtype=torch.long)
    for i, (suffix, e) in enumerate(zip(suffixes, examples, strict=True)):
        ids[i, :len(suffix)] = torch.tensor(suffix)
        mask[i, length:length + len(suffix)] = 1
        labels[i, :len(suffix)] = torch.tensor(e["labels"][length:])
    positions = torch.arange(length, length + width).expand(rows, -1)
    hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device),
                     position_ids=positions.to(device), past_key_values=cache,
                     use_cache=True).last_hidden_state
    # The hidden state at suffix position j scores the token at j + 1.
    targets = labels[:, 1:].to(device)
    scored = targets != IGNORED
    logps = head(hidden[:, :-1][scored]).float().log_softmax(-1)
    return -logps.gather(-1, targets[scored].unsqueeze(-1)).mean(), length


def _decoder_and_head(model):
    """(config, decoder, LM head) of `model`, or None where running the decoder on a shared
    cache would not be the forward TRL's loss takes."""
    peft = getattr(model, "active_peft_config", None)
    if peft is not None and getattr(peft, "is_prompt_learning", False):
        return None
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = getattr(target, "base_model", None)  # e.g. LlamaForCausalLM.model
    head = target.get_output_embeddings()
    if decoder is None or decoder is target or head is None:
        return None
    text_config = target.config.get_text_config()
    if (any(getattr(text_config, name, None) is not None for name in lm_head.LOGIT_TRANSFORMS)
            or getattr(text_config, "output_router_logits", False)
            or getattr(target, "is_gradient_checkpointing", False)):
        return None
    if model.training and (getattr(text_config, "attention_dropout", 0.0) or any(
            isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())):
        return None
    return target.config, decoder, head
