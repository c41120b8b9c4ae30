"""A warm start: supervised steps on demonstrations before the learner reads any traffic.

    TRACETRAIN_LEARNER__WARM_START=demos.jsonl tracetrain learner
    tracetrain demo --task calc --warm-start 450      # the demo writes calc demonstrations

Why: a policy that almost never succeeds gives the loop nothing to learn from. The calc agent's
base model solves 1.5% of its word problems, so `sft` sees about one successful trace a minute
and `rl` a group whose rollouts all score 0 (no advantage). A few hundred worked examples
teach the format and the mapping from words to an expression (measured: 300 calc problems, one
pass, lr 1e-3, took held-out accuracy from 0.015 to 0.395 on phrasings never demonstrated);
traffic then has successes to reinforce.

Each line of the file is one demonstration in TRL's conversational prompt-completion form:

    {"prompt": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
     "completion": [{"role": "assistant", "content": "<tool>calc: 14 * 31</tool>"}]}

The prompt is rendered with the policy's chat template and generation prompt (what the engine
renders for the same messages), the completion is the assistant's text and the template's turn
end, as a sampled response ends. A demonstration that continues the one before it (a worked
problem's second call) is trained in one sequence with it (`chains`, `transitions`). Every
sequence is trained as a transition with return 1 and advantage 1 in whatever mode the learner
runs: in `sft` the imitation loss (a mean over the batch's trained tokens); in `rl` the same
imitation loss with the batch's shared prefix run once (trainer.py `train_step(imitate=True)`),
or, where that does not take the batch (a single row, several ranks, `share_prefix` off), the
policy gradient of an on-policy ratio (the same direction; `grpo` takes a mean per sequence);
in `kto` a desirable example.

It runs once: only when the learner starts with no registered checkpoint of its model (a
restart resumes from the warm start's version instead), for `warm_start_epochs` passes in an
order fixed by `learner.seed`, in micro-batches of `batch_size`, at `warm_start_lr` (throughout,
or as the peak of `warm_start_schedule` cosine: `rate`); its result is registered as the first
version (so the engine serves it before any traffic is trained on). The ledger lists the
demonstrations by id (`warm:<file digest>:<line>`, a chain's `<first>-<last>`), so a replay
with the same settings takes the same steps.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from learner.errors import LearnerError
from tracetrain.modes import WARM_START_SCHEDULES, one_of

log = logging.getLogger("tracetrain.learner")
FORMAT = ('{"prompt": [{"role": ..., "content": ...}, ...], '
          '"completion": [{"role": "assistant", "content": ...}]}')


def read_demonstrations(path: Path) -> list[tuple[list[dict], str]]:
    """(prompt messages, completion text) per line of `path`; an error names the line."""
    path = Path(path)
    if not path.is_file():
        raise LearnerError(f"learner.warm_start {str(path)!r}: no such file (expected a JSONL "
                           f"file of demonstrations, one {FORMAT} per line)")
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, completion = row["prompt"], row["completion"]
            if not (isinstance(prompt, list) and prompt and all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role")
                    for m in prompt)):
                raise ValueError("prompt")
            if not (isinstance(completion, list) and len(completion) == 1
                    and completion[0].get("role") == "assistant"
                    and isinstance(completion[0].get("content"), str)):
                raise ValueError("completion")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LearnerError(f"{path}:{number}: not a demonstration ({exc}); expected "
                               f"{FORMAT}") from exc
        found.append((prompt, completion[0]["content"]))
    if not found:
        raise LearnerError(f"learner.warm_start {str(path)!r} holds no demonstration; expected "
                           f"one {FORMAT} per line")
    return found


def chains(demonstrations: list[tuple[list[dict], str]]) -> list[list[int]]:
    """The demonstrations' indexes, grouped into chains: a demonstration that continues the
    one before it (its prompt is that one's prompt, its completion, then more messages: the
    next call of the same worked problem) joins its chain."""
    found: list[list[int]] = []
    conversation: list[dict] = []  # the last chain's messages, its completions included
    for index, (prompt, completion) in enumerate(demonstrations):
        if found and prompt[:len(conversation)] == conversation:
            found[-1].append(index)
        else:
            found.append([index])
        conversation = [*prompt, {"role": "assistant", "content": completion}]
    return found


def transitions(path: Path, tokenizer, chained: bool = True, prefix: str = "warm") -> list[dict]:
    """The demonstrations as the learner's transitions (token ids of the policy's template).

    `chained`: each of the `chains` is trained as ONE sequence, as the learner trains a
    rollout's calls, the tool results between the calls in the sequence but masked out of the
    loss (`tool_mask` 0, TRL's name). The tokens are exactly those of the calls trained one by
    one (checked here: where a template renders a later call's prompt otherwise, it is trained
    apart), at about half the cost: a calc problem's two calls share a 168-token prompt, so
    393 tokens become 209. A chain's id names its lines (`warm:<digest>:4-5`; `prefix` is
    the id's first part, `rehearse` for learner/rehearsal.py's rows)."""
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    demonstrations = read_demonstrations(path)
    groups = chains(demonstrations) if chained else [[i] for i in range(len(demonstrations))]
    rows: list[dict] = []
    for group in groups:
        row = None
        for index in group:
            prompt, completion = demonstrations[index]
            text = tokenizer.apply_chat_template(prompt, tokenize=False,
                                                 add_generation_prompt=True)
            prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            answer_ids = tokenizer(completion + tokenizer.eos_token,
                                   add_special_tokens=False)["input_ids"]
            sequence = row and row["prompt_token_ids"] + row["response_token_ids"]
            if row and prompt_ids[:len(sequence)] == sequence:
                between = prompt_ids[len(sequence):]
                row["response_token_ids"] += between + answer_ids
                row["tool_mask"] += [0] * len(between) + [1] * len(answer_ids)
                first = row["transition_id"].rsplit(":", 1)[1].split("-")[0]
                row["transition_id"] = row["rollout_id"] = row["task_id"] = \
                    f"{prefix}:{digest}:{first}-{index}"
                continue
            ids = f"{prefix}:{digest}:{index}"
            row = {
                "transition_id": ids, "rollout_id": ids, "task_id": ids,
                "agent_name": "warm_start", "turn_index": 0, "is_last": True,
                "prompt_token_ids": prompt_ids, "response_token_ids": answer_ids,
                "tool_mask": [1] * len(answer_ids),
                "behaviour_logprobs": [], "policy_version": 0, "credited_return": 1.0,
                "final_reward": 1.0, "intermediate_reward": 0.0, "sampling_temperature": None,
                "emitted_ns": 0,
            }
            rows.append(row)
    return rows


def trains_chained(mode: str) -> bool:
    """KTO's collator takes no mask within a completion: its demonstrations go call by call."""
    return mode != "kto"


def steps(policy, path: Path, epochs: int, threads: int | None
          ) -> Iterator[tuple[int, int, list[dict], dict]]:
    """Trains the warm start, yielding (k, total steps, the step's transitions, its metrics)
    once each step is taken. `threads`: torch threads meanwhile (no traffic is trained yet,
    so the caller may give it every core), then back to what they were."""
    learner = policy.learner
    rows = transitions(path, policy.tokenizer, chained=trains_chained(learner.mode))
    order = random.Random(learner.seed)
    batches = []
    for _ in range(epochs):
        shuffled = rows[:]
        order.shuffle(shuffled)
        batches += [shuffled[i:i + learner.batch_size]
                    for i in range(0, len(shuffled), learner.batch_size)]
    import torch  # here: the demo reads and counts demonstrations without it

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    log.info("warm start: %d demonstrations from %s, %d epoch(s), %d steps", len(rows), path,
             epochs, len(batches))
    peak = learner.warm_start_lr or learner.lr
    try:
        with learning_rate(policy) as set_rate:
            for k, batch in enumerate(batches, 1):
                set_rate(rate(k, len(batches), peak, learner.warm_start_schedule))
                ones = [1.0] * len(batch)
                yield k, len(batches), batch, policy.train_step(batch, ones, ones,
                                                                  imitate=True)
    finally:
        torch.set_num_threads(before)


WARMUP_SHARE = 0.05  # of the steps, rising to the peak: Adam's first moments are still noise
FLOOR = 0.1  # of the peak at the last step


def rate(k: int, total: int, peak: float, schedule: str) -> float:
    """Step `k`'s (1-based, of `total`) learning rate. `cosine`: one pass over worked problems
    ends on small steps rather than at the peak, so the version served first is not the last
    few batches'; to a tenth rather than to 0, so that its last problems still teach."""
    if schedule == "constant":
        return peak
    if schedule != "cosine":
        raise LearnerError(f"learner.warm_start_schedule {schedule!r}: expected "
                           f"{one_of(WARM_START_SCHEDULES)}")
    warmup = max(1, round(total * WARMUP_SHARE))
    if k <= warmup:
        return peak * k / warmup
    progress = (k - warmup) / max(1, total - warmup)
    return peak * (FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress)))


@contextmanager
def learning_rate(policy) -> Iterator[Callable[[float], None]]:
    """Yields a setter of the one optimizer's rate for the next step. The scheduler (constant)
    sets each group's rate from its base rate at every step, so both are set, and both
    restored after, so that the checkpoint after the warm start holds the learner's own rate."""
    scheduler, groups = policy.scheduler, policy.optimizer.param_groups
    saved = list(scheduler.base_lrs), [group["lr"] for group in groups]

    def set_rate(lr: float) -> None:
        scheduler.base_lrs = [lr] * len(groups)
        for group in groups:
            group["lr"] = lr

    try:
        yield set_rate
    finally:
        scheduler.base_lrs = saved[0]
        for group, value in zip(groups, saved[1], strict=True):
            group["lr"] = value
