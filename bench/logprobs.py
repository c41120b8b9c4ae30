"""How far the engine's logprobs are from the learner's, and how fast, per base GGUF type.

    .venv/bin/python -m bench.logprobs [--prompts 8] [--tokens 40]

For each type the engine can serve (`q4_1`: the default model's shipped file; `f32`: its dense
copy, the learner's own numbers), llama-server samples `--tokens` tokens at each of
`--temperatures` (1.0, the `train` mode's, and 0.3, the demo agents') for chat prompts of the
calc task, through exactly the request and parsing the engine uses (serving/engine/
generation.py). The learner's model (transformers, float32, the weights the learner trains)
recomputes each sampled token's logprob on the same ids at the same temperature, as the learner
scores a transition at its recorded temperature. Per type and temperature: mean and max
absolute gap per token, the spread (standard deviation) of the per-token importance ratio
exp(learner - engine) that RL's correction sees; per type, output tokens/s at 8 concurrent
requests. Last line, JSON: {"<type>": {"t<temperature>": {...}, "tokens_per_s_8": ...},
"default": settings' choice}.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.llama import bare_completion, throughput, token_prompts
from examples.calc.agent import SYSTEM_PROMPT
from examples.calc.problems import generate
from serving.engine.generation import GenRequest, GenResult, completion_body
from serving.llamacpp.build import find_server
from serving.llamacpp.server import LlamaServer
from serving.llamacpp.weights import base_gguf
from testkit.serving import token_logprobs
from tracetrain.base_model import resolve_base_model
from tracetrain.modes import ENGINE_WEIGHTS
from tracetrain.settings import load_settings


def _gaps(server: LlamaServer, model, prompts: list, tokens: int, temperature: float) -> dict:
    gaps, ratios = [], []
    for at, prompt in enumerate(prompts):
        reply = server.complete(completion_body(GenRequest(
            prompt_ids=list(prompt), max_tokens=tokens, temperature=temperature, seed=at)))
        served = GenResult()
        served.add(reply, 0)
        assert len(served.logprobs) == len(served.token_ids), "logprobs do not line up"
        learner = token_logprobs(model, prompt, served.token_ids, temperature)
        for engine_lp, learner_lp in zip(served.logprobs, learner, strict=True):
            gaps.append(abs(engine_lp - learner_lp))
            ratios.append(math.exp(learner_lp - engine_lp))
    return {"mean_abs_logprob_gap": round(statistics.fmean(gaps), 4),
            "max_abs_logprob_gap": round(max(gaps), 4),
            "ratio_std": round(statistics.pstdev(ratios), 4), "tokens": len(gaps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.3])
    args = parser.parse_args()
    settings = load_settings()
    model_dir = resolve_base_model(settings.base_model, settings.home_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = [tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": p.question}],
        add_generation_prompt=True, return_dict=True)["input_ids"]
        for p in generate(args.prompts, seed=5)]
    out: dict = {}
    for weights in ENGINE_WEIGHTS:
        gguf = base_gguf(model_dir, weights)
        with LlamaServer(find_server(), gguf, slots=8, context=1024,
                         threads=settings.engine.threads) as server:
            out[weights] = {f"t{t}": _gaps(server, model, prompts, args.tokens, t)
                            for t in args.temperatures}
            rate = throughput(bare_completion(server.url, 48), token_prompts(16, 128, 3), 8)
        out[weights]["tokens_per_s_8"] = round(rate, 1)
        print(f"{weights}: {out[weights]}", flush=True)
    print(json.dumps({**out, "default": settings.engine.weights}))


if __name__ == "__main__":
    main()
