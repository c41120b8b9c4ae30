"""A torchrun job that trains `PolicyTrainer` on fixed batches, once per loss type: what a test
compares with the same steps in one process (tests/learner/test_learner_distributed.py).

    torchrun --standalone --nproc-per-node 2 -m testkit.ranked_steps OUT grpo bnpo ...

Settings come from the environment (`settings_env`); rank 0 writes each loss type's trained
weights to OUT/<loss_type>.pt, the other ranks follow it as in `tracetrain learner`. Rank 0 also
writes what it holds of each parameter (OUT/<loss_type>.shards.json) and, for a
`full_finetune` (sharded with FSDP), its checkpoint (OUT/<loss_type>-ckpt) and the weights of a
new policy that resumed from it and trained the batches again (OUT/<loss_type>-resumed.pt)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from learner.advantages import BatchAdvantage
from learner.distributed import follow, join
from learner.trainer import PolicyTrainer
from testkit.learner import make_transition
from tracetrain.settings import Settings, get_settings

BATCH, STEPS = 3, 3


def batches() -> list[list[dict]]:
    """Fixed batches; responses of 3 to 5 tokens, some with behaviour logprobs (an off-policy
    ratio), so rows differ in length and the loss types in their normalisation."""
    records = [make_transition(i, ret=float(i % 2), response=[400 + i, 401, 2, *[5] * (i % 3)],
                               logprobs=[-1.0 - 0.1 * j for j in range(3 + i % 3)] if i % 2 else None,
                               tid=f"tr-{i}")
               for i in range(BATCH * STEPS)]
    return [records[i:i + BATCH] for i in range(0, len(records), BATCH)]


def with_loss(settings: Settings, loss_type: str) -> Settings:
    return settings.model_copy(update={"learner": settings.learner.model_copy(
        update={"loss_type": loss_type, "advantage": "batch"})})


def train(policy: PolicyTrainer) -> dict[str, torch.Tensor]:
    for batch in batches():
        policy.train_step(batch, BatchAdvantage().compute(batch), [1.0] * len(batch))
    return policy.trainable_state()


def holdings(policy: PolicyTrainer) -> dict[str, list]:
    """Each parameter's elements held here, its whole size, and how it is placed."""
    return {n: [p.to_local().numel() if hasattr(p, "to_local") else p.numel(), p.numel(),
                str(getattr(p, "placements", "whole"))]
            for n, p in policy.model.named_parameters()}


def main(out: Path, loss_types: list[str]) -> None:
    settings = get_settings()
    ranks = join(settings)
    for loss_type in loss_types:
        mine = with_loss(settings, loss_type)
        if ranks.leader:
            work = Path(tempfile.mkdtemp())
            policy = PolicyTrainer(mine, work / "trl", ranks)
            (out / f"{loss_type}.shards.json").write_text(json.dumps(holdings(policy)))
            torch.save(train(policy), out / f"{loss_type}.pt")
            if mine.learner.full_finetune:
                policy.save(out / f"{loss_type}-ckpt", {})
                resumed = PolicyTrainer(mine, work / "trl-resumed", ranks)
                resumed.load(out / f"{loss_type}-ckpt")
                torch.save(train(resumed), out / f"{loss_type}-resumed.pt")
            ranks.dismiss()
        else:
            follow(mine, ranks)
    ranks.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
