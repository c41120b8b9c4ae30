"""Embedded engine throughput versus bare transformers `generate`, side by side in one run.

    .venv/bin/python -m bench.engine

Starts the real engine (HTTP, batcher) in this process on a free port, sends the same prompts
sequentially and then 8 at once, and runs bare greedy `model.generate` on the same weights.
Prints output tokens per second; the last line is JSON with `ratio_1` (ours / bare at one
request), `tokens_per_s_1`, `tokens_per_s_8` and `bare_tokens_per_s`.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import torch

from infra import processes
from serving.engine.server import make_server
from tracetrain.settings import load_settings
from tracetrain.settings.serving import EngineSettings

PROMPTS = ["What is the capital of France?", "Name three colours.", "What is 12 plus 7?",
           "Write a haiku about rain.", "Say hello in Spanish.", "What is a prime number?",
           "Name a large animal.", "Why is the sky blue?"]
MAX_TOKENS = 16


def main() -> None:
    settings = load_settings(engine=EngineSettings(port=processes.free_port(), max_batch=8))
    server = make_server(settings)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://{settings.engine.host}:{settings.engine.port}"
    processes.wait_until(lambda: processes.port_in_use("127.0.0.1", settings.engine.port), 120,
                         "bench engine")
    policy = server.config.app.state.batcher.policy
    http = httpx.Client(timeout=300)

    def ours(text: str) -> int:
        body = {"model": "policy", "messages": [{"role": "user", "content": text}],
                "max_tokens": MAX_TOKENS, "temperature": 0}
        return http.post(f"{url}/v1/chat/completions", json=body).json()["usage"][
            "completion_tokens"]

    def bare(text: str) -> int:
        ids = policy.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                   add_generation_prompt=True, return_dict=True,
                                                   return_tensors="pt")
        with torch.inference_mode():
            out = policy.model.generate(**ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                                        pad_token_id=policy.pad_id)
        return out.shape[1] - ids["input_ids"].shape[1]

    ours(PROMPTS[0])
    bare(PROMPTS[0])  # warm both paths
    figures = {}
    for label, run in (("bare", bare), ("ours_1", ours)):
        started, tokens = time.perf_counter(), 0
        for text in PROMPTS[:4]:
            tokens += run(text)
        figures[label] = tokens / (time.perf_counter() - started)
        print(f"{label}: {figures[label]:.1f} tokens/s ({tokens} tokens)")
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        tokens = sum(pool.map(ours, PROMPTS))
    figures["ours_8"] = tokens / (time.perf_counter() - started)
    print(f"ours_8: {figures['ours_8']:.1f} tokens/s ({tokens} tokens)")
    server.should_exit = True
    thread.join(timeout=30)
    print(json.dumps({"ratio_1": round(figures["ours_1"] / figures["bare"], 3),
                      "tokens_per_s_1": round(figures["ours_1"], 2),
                      "tokens_per_s_8": round(figures["ours_8"], 2),
                      "bare_tokens_per_s": round(figures["bare"], 2)}))


if __name__ == "__main__":
    main()
