"""What one generation asks for and what it gives back, and how both map to llama-server's
native `/completion` API.

The prompt travels as token ids (the policy's own tokenizer and chat template made them), so
the ids the learner trains on are exactly those the engine conditioned on. Sampling is the
engine's own contract, not llama-server's defaults: temperature then nucleus (top_p), nothing
else (llama-server would add top_k=40, min_p=0.05 and more). Reported logprobs are those of the
distribution the token was sampled from: llama-server's post-sampling probabilities, the
softmax of logits / temperature over the whole vocabulary (top_p 1, the default, truncates
nothing), what the learner's forward pass divided by the recorded temperature gives. A greedy
call (temperature below GREEDY_BELOW) reports the raw model's, log-softmax of the logits
(post-sampling, its one candidate would have probability 1), what the learner scores greedy
transitions at.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tracetrain.numbers import GREEDY_BELOW

TokenCallback = Callable[[str, list[int]], None]
# llama-server's stop_type -> OpenAI finish_reason
_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0
    ignore_eos: bool = False  # vLLM's sampling parameter: generate max_tokens regardless


@dataclass
class GenResult:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"
    policy_version: int = 0

    def add(self, piece: dict, top: int) -> None:
        """Take one llama-server answer (or streamed chunk): its tokens and their logprobs."""
        self.token_ids.extend(piece.get("tokens") or [])
        for entry in piece.get("completion_probabilities") or []:
            self.logprobs.append(_logprob(entry))
            self.top_logprobs.append([(int(t["id"]), _logprob(t)) for t in
                                      (entry.get("top_logprobs") or entry.get("top_probs")
                                       or [])[:top]])
        self.text += piece.get("content") or ""
        if piece.get("stop") and piece.get("stop_type"):
            self.finish_reason = _FINISH.get(piece["stop_type"], "stop")
            # A stop string's own tokens are generated but not returned as text, and
            # llama-server gives them no probabilities: the response is the returned text's
            # tokens, each with its logprob (what the learner trains on must line up).
            del self.token_ids[len(self.logprobs):]


def _logprob(entry: dict) -> float:
    """llama-server gives `logprob` for raw-model probabilities, `prob` for post-sampling ones."""
    if "logprob" in entry:
        return float(entry["logprob"])
    prob = float(entry["prob"])
    # a probability that underflowed to 0 is -inf: the learner dead-letters non-finite logprobs
    return math.log(prob) if prob > 0 else -math.inf


def completion_body(req: GenRequest, stream: bool = False) -> dict:
    body = {"prompt": req.prompt_ids, "n_predict": req.max_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "top_k": 0, "min_p": 0.0,
            "samplers": ["temperature", "top_p"],
            # one probability is the sampled token's own; more are the alternatives asked for
            "n_probs": max(1, req.top_logprobs),
            "post_sampling_probs": req.temperature >= GREEDY_BELOW,
            "return_tokens": True, "cache_prompt": True, "stream": stream}
    if req.stop:
        body["stop"] = req.stop
    if req.seed is not None:
        body["seed"] = int(req.seed)
    if req.ignore_eos:
        body["ignore_eos"] = True
    return body
