"""What bench.engine and bench.logprobs share: seeded prompts of exact token length, and
timing a batch of requests at a given concurrency."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

# Ordinary tokens of SmolLM2's vocabulary (below are bytes and specials): prompts of exactly
# `length` ids that no tokenizer round-trip can change.
_LOW, _HIGH = 1000, 40000


def token_prompts(count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(_LOW, _HIGH) for _ in range(length)] for _ in range(count)]


def throughput(send: Callable[[list[int]], int], prompts: list[list[int]],
               concurrency: int) -> float:
    """Output tokens per second of `send` (returns the tokens it got) over `prompts`."""
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(send, prompts))
    return tokens / (time.perf_counter() - started)


def bare_completion(url: str, output_tokens: int) -> Callable[[list[int]], int]:
    """llama-server's own /completion as a user calls it: prompt ids in, tokens out."""
    http = httpx.Client(timeout=600)

    def send(prompt: list[int]) -> int:
        body = {"prompt": prompt, "n_predict": output_tokens, "ignore_eos": True,
                "temperature": 1.0, "seed": 0, "cache_prompt": False}
        return http.post(f"{url}/completion", json=body).raise_for_status().json()[
            "tokens_predicted"]

    return send
