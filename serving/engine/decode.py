"""One batched decode: left-padded prompts, a KV cache, per-row sampling, logprobs, stops.

Each row keeps its own temperature, top_p, seed, max_tokens and stop strings, so requests with
different parameters share one forward pass. Reported logprobs are those of the model itself
(log-softmax of the raw logits) for the sampled token: exactly what a forward pass of the same
weights on the same tokens gives, which is what importance ratios need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

TokenCallback = Callable[[int, float, list[tuple[int, float]]], None]


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0
    on_token: TokenCallback | None = None  # streaming: called from the batcher thread
    policy_version: int | None = None  # set by the batcher when the request's batch starts


@dataclass
class GenResult:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"
    policy_version: int = 0


def _pick(logits: torch.Tensor, req: GenRequest, gen: torch.Generator | None) -> int:
    if req.temperature <= 1e-5:
        return int(logits.argmax())
    probs = torch.softmax(logits / req.temperature, dim=-1)
    if req.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        drop = sorted_probs.cumsum(-1) - sorted_probs >= req.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=gen))


def _stop_at(text: str, stops: list[str]) -> int | None:
    cuts = [text.find(s) for s in stops if s and s in text]
    return min(cuts) if cuts else None


@torch.inference_mode()
def generate(model, tokenizer, requests: list[GenRequest], pad_id: int,
             eos_ids: set[int]) -> list[GenResult]:
    rows = len(requests)
    width = max(len(r.prompt_ids) for r in requests)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for i, req in enumerate(requests):
        input_ids[i, width - len(req.prompt_ids):] = torch.tensor(req.prompt_ids)
        mask[i, width - len(req.prompt_ids):] = 1
    # Left padding: positions count only real tokens, so every row sees the positions it
    # would see alone.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    gens = []
    for req in requests:
        gen = None
        if req.seed is not None:
            gen = torch.Generator().manual_seed(int(req.seed))
        gens.append(gen)
    results = [GenResult() for _ in requests]
    done = [False] * rows
    cache = DynamicCache(config=model.config)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    step = 0
    while True:
        logits = out.logits[:, -1, :].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        next_ids = torch.full((rows,), pad_id, dtype=torch.long)
        for i, req in enumerate(requests):
            if done[i]:
                continue
            token = _pick(logits[i], req, gens[i])
            next_ids[i] = token
            res = results[i]
            res.token_ids.append(token)
            res.logprobs.append(float(logprobs[i, token]))
            tops: list[tuple[int, float]] = []
            if req.top_logprobs:
                values, ids = logprobs[i].topk(req.top_logprobs)
                tops = list(zip(ids.tolist(), values.tolist(), strict=True))
            res.top_logprobs.append(tops)
            if req.on_token is not None:
                req.on_token(token, res.logprobs[-1], tops)
            if token in eos_ids:
                res.finish_reason, done[i] = "stop", True
            elif req.stop:
                text = tokenizer.decode(res.token_ids, skip_special_tokens=True)
                if _stop_at(text, req.stop) is not None:
                    res.finish_reason, done[i] = "stop", True
            if not done[i] and len(res.token_ids) >= req.max_tokens:
                res.finish_reason, done[i] = "length", True
        step += 1
        if all(done):
            break
        mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=next_ids[:, None], attention_mask=mask, position_ids=positions,
                    past_key_values=out.past_key_values, use_cache=True)
    for req, res in zip(requests, results, strict=True):
        text = tokenizer.decode(res.token_ids, skip_special_tokens=True)
        cut = _stop_at(text, req.stop) if req.stop else None
        res.text = text if cut is None else text[:cut]
    return results
