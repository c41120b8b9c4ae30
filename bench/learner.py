"""Benchmark: the learner's `rl` step (TRL's GRPO loss) vs a bare PEFT forward/backward/step.

    .venv/bin/python -m bench.learner [--steps 3] [--batch 4] [--tokens 128] [--model DIR]
                                      [--ranks N]

Both loops run in this process, step for step interleaved, on the same tensors (a fixed batch of transitions of
`--tokens` prompt+response tokens), the same base model (default: SmolLM2-135M-Instruct as
safetensors, `resolve_base_model`), the same LoRA (r and target layers from settings), fp32,
after one warm-up step each. Then one checkpoint is registered in a real MLflow server started
here (no Kafka: the Checkpoint announcement is skipped). Prints, last, one JSON line:
ratio (ours tokens/s / bare tokens/s), tokens_per_s, bare_tokens_per_s, peak_rss_mb,
register_s (end of a step to its version registered). With `--ranks N` the same steps also run
as one torchrun job of N ranks (gloo; learner/distributed.py, rank 0 broadcasting each batch),
and `tokens_per_s_by_ranks` shows the step's tokens/s at 1 rank (this process) and N side by
side: on a machine of few cores no speed-up, the overhead of the distributed step.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from infra import mlflow_server, processes
from learner.advantages import BatchAdvantage
from learner.checkpoints import CheckpointStore
from learner.distributed import follow, join
from learner.trainer import PolicyTrainer
from tracetrain.base_model import DEFAULT_MODEL, resolve_base_model
from tracetrain.settings import load_settings, settings_env
from tracetrain.settings.infra import MlflowSettings


def transitions(batch: int, tokens: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    half = tokens // 2
    out = []
    for i in range(batch):
        ids = torch.randint(10, 40000, (tokens,), generator=g).tolist()
        out.append({"transition_id": f"b{i}", "rollout_id": f"r{i}", "task_id": None,
                    "agent_name": "bench", "prompt_token_ids": ids[:half],
                    "response_token_ids": ids[half:],
                    # As an engine reports them; the ratio then uses them (the live path).
                    "behaviour_logprobs": [-10.8] * (tokens - half),
                    "policy_version": 0, "credited_return": float(i % 2)})
    return out


def bare_peft(model_dir: Path, settings, inputs: dict):
    """A plain PEFT loop: HF causal-LM loss on the response tokens, backward, clip, AdamW."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=settings.learner.lora_r,
                                            lora_alpha=settings.learner.lora_alpha,
                                            lora_dropout=0.0, target_modules=list(settings.learner.lora_targets),
                                            task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.learner.lr)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, : inputs["prompt_ids"].size(1)] = -100

    def step() -> int:
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, settings.learner.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return int(mask.sum())

    return step


def ranked(settings, args) -> None:
    """One rank of the torchrun job `--ranks` starts: rank 0 times the steps, prints a JSON
    line; the others follow it."""
    ranks = join(settings)
    if not ranks.leader:
        follow(settings, ranks)
        ranks.close()
        return
    batch = transitions(args.batch, args.tokens)
    advantages, weights = BatchAdvantage().compute(batch), [1.0] * len(batch)
    policy = PolicyTrainer(settings, Path(tempfile.mkdtemp(prefix="tt-bench-rank0-")), ranks)
    policy.train_step(batch, advantages, weights)  # warm-up
    started, tokens = time.perf_counter(), 0
    for _ in range(args.steps):
        tokens += int(policy.train_step(batch, advantages, weights)["tokens"])
    print(json.dumps({"ranks": ranks.world, "tokens_per_s": tokens / (time.perf_counter() - started)}))
    ranks.dismiss()
    ranks.close()


def run_ranks(settings, args) -> float:
    """tokens/s of the step as a torchrun job of `args.ranks` ranks on this machine."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(args.ranks), "-m", "bench.learner", "--steps", str(args.steps), "--batch",
            str(args.batch), "--tokens", str(args.tokens), "--model", settings.base_model]
    done = subprocess.run(argv, env={**os.environ, **settings_env(settings)}, text=True,
                          capture_output=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"ranks"')]
    if done.returncode or not lines:
        raise SystemExit(f"the {args.ranks}-rank job failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(lines[-1])["tokens_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--ranks", type=int, default=1, help="also run the step on this many ranks")
    args = ap.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a rank of the job `--ranks` started
        return ranked(load_settings(base_model=args.model), args)
    home = Path(tempfile.mkdtemp(prefix="tt-bench-learner-"))
    settings = load_settings(home=home, base_model=args.model)
    if args.model == DEFAULT_MODEL:  # reuse the repo's converted copy instead of converting again
        settings = settings.model_copy(update={"base_model": str(
            resolve_base_model(DEFAULT_MODEL, Path(".tracetrain")))})
    batch = transitions(args.batch, args.tokens)
    advantages = BatchAdvantage().compute(batch)
    weights = [1.0] * len(batch)

    policy = PolicyTrainer(settings, home / "trl")
    bare_step = bare_peft(policy.model_dir, settings, policy.inputs(batch, advantages, weights))
    policy.train_step(batch, advantages, weights)  # warm-up, both
    bare_step()
    # Interleaved, so that load from other processes on the machine hits both loops alike.
    ours_s = bare_s = 0.0
    ours_tokens = bare_tokens = 0
    for _ in range(args.steps):
        t0 = time.perf_counter()
        metrics = policy.train_step(batch, advantages, weights)
        t1 = time.perf_counter()
        bare_tokens += bare_step()
        t2 = time.perf_counter()
        ours_s, bare_s = ours_s + t1 - t0, bare_s + t2 - t1
        ours_tokens += int(metrics["tokens"])
    ours, bare = ours_tokens / ours_s, bare_tokens / bare_s

    mlflow = MlflowSettings(port=processes.free_port())
    mlflow_server.start(home / "mlflow-home", mlflow)
    try:
        store = CheckpointStore(settings.model_copy(update={"mlflow": mlflow}), "bench",
                                "bench-policy", announce=False)
        store.start_run("bench", {})
        saved = store.save(policy, {"offsets": {}}, step=policy.step, policy_version=1,
                           offsets={}, metrics=metrics)
        store.end_run()
    finally:
        mlflow_server.stop(home / "mlflow-home")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    by_ranks = {}
    if args.ranks > 1:
        by_ranks = {"tokens_per_s_by_ranks": {"1": round(ours, 1),
                                              str(args.ranks): round(run_ranks(settings, args), 1)}}
    print(json.dumps({"ratio": round(ours / bare, 3), "tokens_per_s": round(ours, 1),
                      "bare_tokens_per_s": round(bare, 1), "peak_rss_mb": round(peak_mb),
                      "register_s": round(saved.register_s, 3), "model": settings.base_model,
                      "batch": args.batch, "tokens": args.tokens, "steps": args.steps,
                      **by_ranks}))


if __name__ == "__main__":
    main()
