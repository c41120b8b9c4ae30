"""OpenAI request bodies to `GenRequest`s, and results to OpenAI (vLLM-named) response bodies.

Field names follow vLLM so the gateway treats both engines alike: top-level
`prompt_token_ids`, `choices[i].token_ids`, `choices[i].logprobs.content[j].{token,logprob}`,
plus `policy_version` (also sent as the `X-Policy-Version` header).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from serving.engine.generation import GenRequest, GenResult
from tracetrain.errors import BadRequest


def sampling(body: dict, prompt_ids: list[int], context: int, default_max: int) -> GenRequest:
    if body.get("n", 1) not in (1, None):
        raise BadRequest(f"n={body['n']} is not supported; expected n=1")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is None:
        max_tokens = max(1, min(default_max, context - len(prompt_ids)))
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(f"max_tokens={max_tokens!r}; expected a positive integer")
    if len(prompt_ids) + max_tokens > context:
        raise BadRequest(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion."
        )
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else float(temperature)
    top_p = body.get("top_p")
    top_p = 1.0 if top_p is None else float(top_p)
    if temperature < 0 or not 0 < top_p <= 1:
        raise BadRequest(f"temperature={temperature}, top_p={top_p}; expected temperature >= 0 "
                         "and 0 < top_p <= 1")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else list(stop)
    top = body.get("top_logprobs") or 0
    if isinstance(body.get("logprobs"), int) and not isinstance(body.get("logprobs"), bool):
        top = body["logprobs"]  # /v1/completions: logprobs is the number of alternatives
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest(f"ignore_eos={ignore_eos!r}; expected true or false")
    return GenRequest(prompt_ids=prompt_ids, max_tokens=max_tokens, temperature=temperature,
                      top_p=top_p, seed=body.get("seed"), stop=stop, top_logprobs=int(top),
                      ignore_eos=ignore_eos)


def _token_entry(tokenizer, token: int, logprob: float, tops: list) -> dict:
    text = tokenizer.decode([token])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()),
            "top_logprobs": [{"token": tokenizer.decode([t]), "logprob": lp,
                              "bytes": list(tokenizer.decode([t]).encode())} for t, lp in tops]}


def chat_logprobs(tokenizer, result: GenResult) -> dict:
    return {"content": [_token_entry(tokenizer, t, lp, tops) for t, lp, tops in
                        zip(result.token_ids, result.logprobs, result.top_logprobs, strict=True)]}


def usage(prompt_ids: list[int], result: GenResult) -> dict:
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": len(result.token_ids),
            "total_tokens": len(prompt_ids) + len(result.token_ids)}


def chat_response(tokenizer, model: str, prompt_ids: list[int], result: GenResult,
                  message: dict, finish_reason: str, want_logprobs: bool) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": chat_logprobs(tokenizer, result) if want_logprobs else None,
            "finish_reason": finish_reason,
            "token_ids": result.token_ids,
        }],
        "usage": usage(prompt_ids, result),
        "prompt_token_ids": prompt_ids,
        "policy_version": result.policy_version,
    }


def completion_response(tokenizer, model: str, prompt_ids: list[int], result: GenResult,
                        want_logprobs: bool) -> dict[str, Any]:
    logprobs = None
    if want_logprobs:
        tokens = [tokenizer.decode([t]) for t in result.token_ids]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        logprobs = {"tokens": tokens, "token_logprobs": result.logprobs, "text_offset": offsets,
                    "top_logprobs": [{tokenizer.decode([t]): lp for t, lp in tops}
                                     for tops in result.top_logprobs]}
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": result.text, "logprobs": logprobs,
                     "finish_reason": result.finish_reason, "token_ids": result.token_ids,
                     "prompt_token_ids": prompt_ids}],
        "usage": usage(prompt_ids, result),
        "prompt_token_ids": prompt_ids,
        "policy_version": result.policy_version,
    }
