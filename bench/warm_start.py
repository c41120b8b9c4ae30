"""Benchmark: the `sft` warm-start step with the rows' shared prefix run once, and without.

    .venv/bin/python -m bench.warm_start [--steps 3] [--batch 8] [--model DIR]

Two learners in this process (`sft`, LoRA on all seven linear layers as the calc demo trains,
fp32, the same seed): one with `learner.share_prefix` (learner/shared_prefix.py), one
without (TRL's collator and `SFTTrainer.compute_loss` on the whole rows). Both take the same
micro-batches of calc warm-start rows (`demo.tasks`' worked problems, chained as the warm
start trains them: learner/warm_start.py), step for step interleaved after one warm-up step
each, so load from other processes hits both alike; from the same start they take the same
steps, which `max_loss_difference` checks. Prints, last, one JSON line: ratio (shared
tokens/s / unshared tokens/s), tokens_per_s, unshared_tokens_per_s, shared_prefix_tokens
(mean over the steps), tokens (per step), max_loss_difference.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from demo.run import WARM_START_SEED
from demo.tasks import get_task
from learner import warm_start
from learner.trainer import PolicyTrainer
from tracetrain.base_model import DEFAULT_MODEL, resolve_base_model
from tracetrain.settings import load_settings
from tracetrain.settings.learner import LORA_ALL_LINEAR


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tt-bench-warm-"))
    model = str(resolve_base_model(DEFAULT_MODEL, Path(".tracetrain"))
                if args.model == DEFAULT_MODEL else args.model)
    base = load_settings(home=home, base_model=model)
    path = home / "warm_start.jsonl"
    problems = (args.steps + 1) * args.batch
    path.write_text("".join(json.dumps(row) + "\n"
                            for row in get_task("calc").demonstrations(problems, seed=WARM_START_SEED)))

    policies = {}
    for share in (True, False):
        learner = base.learner.model_copy(update={
            "mode": "sft", "batch_size": args.batch, "lr": 1e-3,
            "lora_targets": list(LORA_ALL_LINEAR), "share_prefix": share})
        policies[share] = PolicyTrainer(base.model_copy(update={"learner": learner}),
                                        home / f"work-{share}")
    rows = warm_start.transitions(path, policies[True].tokenizer)
    batches = [rows[i:i + args.batch] for i in range(0, len(rows), args.batch)]
    ones = [1.0] * args.batch
    for policy in policies.values():  # warm-up
        policy.train_step(batches[0], ones, ones)

    seconds, tokens, shared, gap = {True: 0.0, False: 0.0}, 0, [], 0.0
    for batch in batches[1:args.steps + 1]:
        losses = {}
        for share, policy in policies.items():
            started = time.perf_counter()
            metrics = policy.train_step(batch, ones, ones)
            seconds[share] += time.perf_counter() - started
            losses[share] = metrics["loss"]
            if share:
                tokens += int(metrics["tokens"])
                shared.append(metrics["shared_prefix_tokens"])
        gap = max(gap, abs(losses[True] - losses[False]))
    steps = len(shared)
    ours, theirs = tokens / seconds[True], tokens / seconds[False]
    print(json.dumps({"ratio": round(ours / theirs, 3), "tokens_per_s": round(ours, 1),
                      "unshared_tokens_per_s": round(theirs, 1),
                      "shared_prefix_tokens": round(sum(shared) / steps, 1),
                      "tokens": round(tokens / steps, 1), "max_loss_difference": gap,
                      "model": model, "batch": args.batch, "steps": steps,
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
