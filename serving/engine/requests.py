"""OpenAI request bodies to `GenRequest`s, and results to OpenAI (vLLM-named) response bodies.

Field names follow vLLM so the gateway treats both engines alike: top-level
`prompt_token_ids`, `choices[i].token_ids`, `choices[i].logprobs.content[j].{token,logprob}`,
plus `policy_version` (also sent as the `X-Policy-Version` header).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

from serving.engine.generation import GenRequest, GenResult
from tracetrain.errors import BadRequest
from tracetrain.numbers import finite_real_problem

# OpenAI's bound on top_logprobs (and vLLM's default max_logprobs): each alternative is sent
# back for every token, so an unbounded count makes one answer as large as the vocabulary.
TOP_LOGPROBS_MAX = 20
SEED_RANGE = (-(2**63), 2**64 - 1)  # 64 bits, signed (OpenAI) or not; llama.cpp wraps it


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(body: dict, name: str, low: int, high: int, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not is_int(value) or not low <= value <= high:
        raise BadRequest(f"{name}={value!r}; expected an integer from {low} to {high}")
    return value


def _real(body: dict, name: str, default: float, ok, expected: str) -> float:
    value = body.get(name)
    if value is None:
        return default
    try:
        # an int past a float's range (temperature=10**400) would overflow float()
        if finite_real_problem(value) is None and ok(value):
            return float(value)
    except OverflowError:
        pass
    raise BadRequest(f"{name}={value!r}; expected a finite number {expected}")


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest(f"stop={body['stop']!r}; expected a non-empty string or a list of them")
    return stop


def prompt_token_ids(prompt: list, vocab: int) -> list[int]:
    """A prompt given as token ids: each must be a token of the model's vocabulary."""
    for at, token in enumerate(prompt):
        if not is_int(token) or not 0 <= token < vocab:
            raise BadRequest(f"prompt[{at}]={token!r}; expected a token id from 0 to {vocab - 1}")
    return list(prompt)


def sampling(body: dict, prompt_ids: list[int], context: int, default_max: int) -> GenRequest:
    """The request's generation fields, each checked here so that llama-server only ever sees
    valid ones (a 400 naming the field, never a 500 or a 502)."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    room = context - len(prompt_ids)
    max_tokens = _int(body, name, 1, 2**31 - 1, max(1, min(default_max, room)))
    if len(prompt_ids) + max_tokens > context:
        raise BadRequest(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion."
        )
    temperature = _real(body, "temperature", 1.0, lambda t: t >= 0, ">= 0")
    top_p = _real(body, "top_p", 1.0, lambda p: 0 < p <= 1, "in (0, 1]")
    # /v1/completions: `logprobs` is the number of alternatives; in chat it is a flag
    count = "logprobs" if is_int(body.get("logprobs")) else "top_logprobs"
    top = _int(body, count, 0, TOP_LOGPROBS_MAX, 0)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest(f"ignore_eos={ignore_eos!r}; expected true or false")
    return GenRequest(prompt_ids=prompt_ids, max_tokens=max_tokens, temperature=temperature,
                      top_p=top_p, seed=_int(body, "seed", *SEED_RANGE, None), stop=_stop(body),
                      top_logprobs=top, ignore_eos=ignore_eos)


def choices(body: dict, req: GenRequest, most: int) -> list[GenRequest]:
    """One generation per choice asked for (`n`, at most `most`). A seeded call seeds choice i
    with seed + i, so its choices differ from each other (not token for token what a lone call
    with that seed gives: sharing decode steps moves sampled logits by float noise)."""
    n = _int(body, "n", 1, most, 1)
    if req.seed is None:
        return [replace(req) for _ in range(n)]
    span = SEED_RANGE[1] - SEED_RANGE[0] + 1
    return [replace(req, seed=(req.seed + i - SEED_RANGE[0]) % span + SEED_RANGE[0])
            for i in range(n)]


def _token_entry(tokenizer, token: int, logprob: float, tops: list) -> dict:
    text = tokenizer.decode([token])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()),
            "top_logprobs": [{"token": tokenizer.decode([t]), "logprob": lp,
                              "bytes": list(tokenizer.decode([t]).encode())} for t, lp in tops]}


def chat_logprobs(tokenizer, result: GenResult) -> dict:
    return {"content": [_token_entry(tokenizer, t, lp, tops) for t, lp, tops in
                        zip(result.token_ids, result.logprobs, result.top_logprobs, strict=True)]}


def usage(prompt_ids: list[int], results: list[GenResult]) -> dict:
    """OpenAI's count: the prompt once, the completion tokens of every choice."""
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
            "total_tokens": len(prompt_ids) + completion}


def chat_response(tokenizer, model: str, prompt_ids: list[int],
                  answers: list[tuple[GenResult, dict, str]], want_logprobs: bool) -> dict[str, Any]:
    """`answers`: each choice's (result, message, finish_reason), in choice order; all come
    from one upstream, so one policy_version."""
    results = [result for result, _, _ in answers]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": index,
            "message": message,
            "logprobs": chat_logprobs(tokenizer, result) if want_logprobs else None,
            "finish_reason": finish_reason,
            "token_ids": result.token_ids,
        } for index, (result, message, finish_reason) in enumerate(answers)],
        "usage": usage(prompt_ids, results),
        "prompt_token_ids": prompt_ids,
        "policy_version": results[0].policy_version,
    }


def completion_logprobs(tokenizer, result: GenResult) -> dict:
    tokens = [tokenizer.decode([t]) for t in result.token_ids]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": result.logprobs, "text_offset": offsets,
            "top_logprobs": [{tokenizer.decode([t]): lp for t, lp in tops}
                             for tops in result.top_logprobs]}


def completion_response(tokenizer, model: str, prompt_ids: list[int], results: list[GenResult],
                        want_logprobs: bool) -> dict[str, Any]:
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": index, "text": result.text,
                     "logprobs": completion_logprobs(tokenizer, result) if want_logprobs else None,
                     "finish_reason": result.finish_reason, "token_ids": result.token_ids,
                     "prompt_token_ids": prompt_ids} for index, result in enumerate(results)],
        "usage": usage(prompt_ids, results),
        "prompt_token_ids": prompt_ids,
        "policy_version": results[0].policy_version,
    }
