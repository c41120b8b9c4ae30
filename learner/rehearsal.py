"""Rehearsal: a few demonstrations trained in every traffic step, beside the traffic.

    TRACETRAIN_LEARNER__REHEARSAL=demos.jsonl TRACETRAIN_LEARNER__REHEARSAL_PER_STEP=4 tracetrain learner
    tracetrain demo --rehearsal 4          # the demo writes fresh calc demonstrations for it

Why: a policy trained only on its own traffic can drift from what its warm start taught. The
calc demo's traffic moved held-out accuracy by +0.004, +0.005 and -0.080 in three default runs
(README, the demo): what it reinforces is whatever happened to score, and nothing holds the rest
in place. InstructGPT's answer (PPO-ptx) is to add the pretraining loss to every RL step; this is
the same idea with demonstrations: each step also imitates `rehearsal_per_step` worked examples,
so the policy keeps learning the skill the traffic samples from while the traffic teaches it
what succeeds on its own problems.

The file is in the warm start's form (learner/warm_start.py: TRL's conversational prompt-
completion JSONL; a worked problem's calls are one chain, one row). Its rows are taken in an
order fixed by `learner.seed`, reshuffled on every pass, with advantage 1 and weight 1, like
a warm start's, in whatever mode the learner runs (`sft`: they pass the return threshold; `rl`:
an on-policy ratio, as warm-start rows). They are not traffic: a step that fails sends only its
traffic to the DLQ. The position in the file is stored in every checkpoint, so a resumed or
replayed learner takes the same rows; a skipped step's rows are handed out again, and a policy
the probe set rejects goes back to its last checkpoint's position with its weights (the
rejected steps' rows are trained again). Their ids start with `rehearse:` in the ledger.
"""

from __future__ import annotations

import random
from pathlib import Path

from learner import warm_start


class Rehearsal:
    def __init__(self, path: Path, per_step: int, tokenizer, mode: str, seed: int):
        self.rows = warm_start.transitions(path, tokenizer, chained=warm_start.trains_chained(mode),
                                           prefix="rehearse")
        self.per_step, self.seed = per_step, seed
        self.taken = 0  # rows handed out since the start: the position, over every pass

    def take(self) -> list[dict]:
        """The next `per_step` rows (copies: the loop marks the rows it trains)."""
        picked = [self._row(self.taken + i) for i in range(self.per_step)]
        self.taken += self.per_step
        return picked

    def put_back(self, rows: list[dict]) -> None:
        """The rows of the last `take` were not trained (the step was skipped): the next
        `take` hands them out again."""
        self.taken -= len(rows)

    def _row(self, k: int) -> dict:
        passed, index = divmod(k, len(self.rows))
        order = list(range(len(self.rows)))
        random.Random(f"{self.seed}:{passed}").shuffle(order)
        return dict(self.rows[order[index]])

    def state_dict(self) -> dict:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict) -> None:
        self.taken = int(state.get("taken", 0))
