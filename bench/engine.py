"""Embedded engine throughput vs bare llama-server and vs bare transformers `generate`, side by
side in one run.

    .venv/bin/python -m bench.engine [--weights f32|q4_1] [--rounds 3]

Ours: the real engine (tracetrain's HTTP API over llama-server; token ids and the sampled
tokens' logprobs returned) started in this process. Bare llama-server: the same binary on the
same GGUF with the same slots and threads, called on its own /completion (no logprobs). Bare
transformers: `generate` on the same weights, batched (what the engine was built on before).
Every request: a 128-token prompt (seeded token ids, new ones every round so no prompt cache
helps), 48 output tokens (ignore_eos), temperature 1. At 1 and 8 concurrent requests, ours and
bare llama-server alternate for `--rounds` rounds; ratios are medians of the rounds' ratios.
Throughput is output tokens over wall time, the prompt's processing included (a 128-token
prefill costs about as long as the 48-token decode here). For comparison with llama.cpp's own
figures, `llama-batched-bench` (same binary, GGUF and threads) gives the decode-only rate
(`llama_decode_tokens_per_s_*`, its S_TG) at 1, 8 and 16 sequences.
Last line, JSON: ratio_1, ratio_8 (ours / bare llama-server), tokens_per_s_1, tokens_per_s_8
(ours), speedup_8 (ours / bare transformers at 8), and the bare figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import threading
import time

import httpx
import torch

from bench.llama import bare_completion, throughput, token_prompts
from infra import processes
from serving.engine.server import make_server
from serving.llamacpp.server import LlamaServer
from tracetrain.modes import ENGINE_WEIGHTS
from tracetrain.settings import load_settings
from tracetrain.settings.serving import EngineSettings

PROMPT_TOKENS, OUTPUT_TOKENS, CONCURRENT = 128, 48, 8


def ours_completion(url: str):
    http = httpx.Client(timeout=600)

    def send(prompt: list[int]) -> int:
        body = {"model": "policy", "prompt": prompt, "max_tokens": OUTPUT_TOKENS,
                "ignore_eos": True, "temperature": 1.0, "seed": 0, "logprobs": 1}
        reply = http.post(f"{url}/v1/completions", json=body).raise_for_status().json()
        choice = reply["choices"][0]
        assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
        return len(choice["token_ids"])

    return send


def transformers_throughput(model_dir, prompts: list[list[int]], concurrency: int) -> float:
    """Bare `generate`, `concurrency` prompts per batch (equal lengths: no padding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    started, tokens = time.perf_counter(), 0
    for at in range(0, len(prompts), concurrency):
        ids = torch.tensor(prompts[at:at + concurrency])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=1.0, top_k=0, max_new_tokens=OUTPUT_TOKENS,
                                 min_new_tokens=OUTPUT_TOKENS, pad_token_id=0)
        tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return tokens / (time.perf_counter() - started)


def decode_rates(binary, gguf, threads: int | None) -> dict[int, float]:
    """llama-batched-bench's S_TG (decode tokens/s) at 1, 8 and 16 parallel sequences."""
    bench = binary.with_name("llama-batched-bench")
    argv = [str(bench), "-m", str(gguf), "-t", str(threads or os.cpu_count() or 2),
            "-npp", str(PROMPT_TOKENS), "-ntg", str(OUTPUT_TOKENS), "-npl", "1,8,16", "-c", "4096"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    rates = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 10 and cells[2].isdigit():
            rates[int(cells[2])] = float(cells[7])  # columns: PP TG B N_KV T_PP S_PP T_TG S_TG
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", choices=ENGINE_WEIGHTS, default=None,
                        help="base GGUF (default: settings.engine.weights)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    defaults = load_settings().engine
    engine = EngineSettings(port=processes.free_port(), slots=CONCURRENT,
                            weights=args.weights or defaults.weights, threads=defaults.threads)
    settings = load_settings(engine=engine)
    server = make_server(settings)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://{engine.host}:{engine.port}"
    processes.wait_until(lambda: processes.port_in_use("127.0.0.1", engine.port), 120,
                         "bench engine")
    policy = server.config.app.state.policy
    context = min(engine.max_context, policy.context_length)
    bare = LlamaServer(policy.binary, policy.base, slots=engine.slots, context=context,
                       threads=engine.threads).start()
    ours_send, bare_send = ours_completion(url), bare_completion(bare.url, OUTPUT_TOKENS)
    ours_send(token_prompts(1, PROMPT_TOKENS, 999)[0])  # warm both
    bare_send(token_prompts(1, PROMPT_TOKENS, 998)[0])
    figures: dict[str, list[float]] = {}
    try:
        for round_ in range(args.rounds):
            for concurrency in (1, CONCURRENT):
                count = 4 if concurrency == 1 else CONCURRENT * 2
                for side, (name, send) in enumerate((("ours", ours_send), ("bare", bare_send))):
                    seed = round_ * 100 + concurrency * 10 + side
                    rate = throughput(send, token_prompts(count, PROMPT_TOKENS, seed),
                                      concurrency)
                    figures.setdefault(f"{name}_{concurrency}", []).append(rate)
                ratio = figures[f"ours_{concurrency}"][-1] / figures[f"bare_{concurrency}"][-1]
                figures.setdefault(f"ratio_{concurrency}", []).append(ratio)
                print(f"round {round_ + 1}, {concurrency} concurrent: ours "
                      f"{figures[f'ours_{concurrency}'][-1]:.1f} tokens/s, bare llama-server "
                      f"{figures[f'bare_{concurrency}'][-1]:.1f} (ratio {ratio:.3f})", flush=True)
    finally:
        bare.stop()
        server.should_exit = True
        thread.join(timeout=60)
    hf = {c: transformers_throughput(policy.model_dir, token_prompts(
        c * 2 if c > 1 else 2, PROMPT_TOKENS, 7), c) for c in (1, CONCURRENT)}
    print(f"bare transformers: {hf[1]:.1f} tokens/s at 1, {hf[CONCURRENT]:.1f} at {CONCURRENT}")
    decode = decode_rates(policy.binary, policy.base, engine.threads)
    print(f"llama-batched-bench decode (S_TG): {decode}")
    med = {key: statistics.median(values) for key, values in figures.items()}
    print(json.dumps({
        "weights": engine.weights, "slots": engine.slots, "threads": engine.threads,
        "ratio_1": round(med["ratio_1"], 3), "ratio_8": round(med[f"ratio_{CONCURRENT}"], 3),
        "tokens_per_s_1": round(med["ours_1"], 1),
        "tokens_per_s_8": round(med[f"ours_{CONCURRENT}"], 1),
        "speedup_8": round(med[f"ours_{CONCURRENT}"] / hf[CONCURRENT], 2),
        "bare_llama_tokens_per_s_1": round(med["bare_1"], 1),
        "bare_llama_tokens_per_s_8": round(med[f"bare_{CONCURRENT}"], 1),
        "bare_transformers_tokens_per_s_1": round(hf[1], 1),
        "bare_transformers_tokens_per_s_8": round(hf[CONCURRENT], 1),
        **{f"llama_decode_tokens_per_s_{n}": rate for n, rate in sorted(decode.items())}}))


if __name__ == "__main__":
    main()
