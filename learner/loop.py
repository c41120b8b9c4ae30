"""The learner's loop: consume micro-batches, train, checkpoint, commit; resumable and bounded.

    tracetrain learner [--max-steps N] [--max-seconds S]      # learner/cli.py
    result = run_learner(settings, max_steps=8)                 # tests and replay drive this

Reads transitions (learner/batches.py); trains (learner/trainer.py); every
`checkpoint_every_steps` steps (or `checkpoint_every_s`), and once more when a bounded run
ends, registers a checkpoint in MLflow (learner/checkpoints.py) and only then commits the
consumed offsets to Kafka (in one Kafka transaction, learner/fencing.py). On start it first
fences every learner started on the experiment before (they can no longer register), then
loads the experiment's newest checkpoint and seeks to the offsets stored in it, whatever the
group's committed offsets say: with the dedupe window of transition ids in the same checkpoint,
each transition changes the model once. A learner that starts with no checkpoint and a
`warm_start` file first trains those demonstrations and registers them as its first version
(learner/warm_start.py); with a `rehearsal` file, every traffic step also trains a few of its
demonstrations (learner/rehearsal.py).

A broken model is never registered: a step whose loss or gradient is not finite is not taken
and its transitions go to the DLQ (non_finite_loss, non_finite_grad); before registering, the
policy is scored on fixed texts (`PolicyTrainer.probe_loss`), and if that is not finite the
transitions trained since the last checkpoint go to the DLQ (non_finite_probe), nothing is
registered and the policy goes back to the last registered checkpoint (or the base model).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event

from learner import warm_start
from learner.advantages import GroupBuffer, make_advantage
from learner.batches import TransitionBatcher
from learner.checkpoints import CheckpointStore, SavedCheckpoint
from learner.distributed import Ranks
from learner.errors import NonFiniteStep
from learner.metrics import LearnerMetrics
from learner.rehearsal import Rehearsal
from learner.trainer import PolicyTrainer
from tracetrain.settings import Settings

log = logging.getLogger("tracetrain.learner")


@dataclass
class LoopResult:
    steps: int = 0
    checkpoints: list[SavedCheckpoint] = field(default_factory=list)
    counters: Counter = field(default_factory=Counter)
    metrics: dict[str, float] = field(default_factory=dict)
    ledger: list[list[str]] = field(default_factory=list)  # transition ids per trained step
    resumed_from: int | None = None
    policy: PolicyTrainer | None = None


def run_learner(
    settings: Settings,
    *,
    experiment: str | None = None,
    model_name: str | None = None,
    topic: str | None = None,
    group_id: str | None = None,
    start_offsets: dict[str, int] | None = None,
    stop_offsets: dict[str, int] | None = None,
    max_steps: int | None = None,
    until_step: int | None = None,
    max_seconds: float | None = None,
    stop: Event | None = None,
    on_step: Callable[[int, dict], None] | None = None,
    resume: bool = True,
    metrics: LearnerMetrics | None = None,
    ranks: Ranks | None = None,
) -> LoopResult:
    """`metrics`: where the live figures go (the CLI serves them); a private one if unset.
    `ranks`: this process leads a torchrun job (learner/distributed.py): its policy's steps
    are taken by every rank, and the followers stop when this returns or raises."""
    learner = settings.learner
    metrics = metrics or LearnerMetrics()
    experiment = experiment or settings.mlflow.experiment
    model_name = model_name or settings.mlflow.registered_model
    store = CheckpointStore(settings, experiment, model_name)
    store.take_over()  # before reading the newest checkpoint: see the module docstring
    work = Path(tempfile.mkdtemp(prefix="tt-learner-"))
    policy = PolicyTrainer(settings, work / "trl", ranks)
    advantage = make_advantage(learner)
    buffer = GroupBuffer(learner.group_size, learner.group_wait_s) if learner.advantage == "group" \
        else None
    rehearsal = Rehearsal(learner.rehearsal, learner.rehearsal_per_step, policy.tokenizer,
                          learner.mode, learner.seed) if learner.rehearsal is not None else None
    result = LoopResult(policy=policy)
    policy_version, offsets, counters, dedupe = 0, start_offsets, Counter(), None

    found = store.latest(work / "resume") if resume else None
    if found is not None:
        version, local = found
        extra = policy.load(local)
        offsets = {**(start_offsets or {}), **extra["offsets"]}
        policy_version = extra["policy_version"]
        result.ledger, counters = extra["ledger"], Counter(extra["counters"])
        advantage.load_state_dict(extra["advantage"])
        if buffer is not None:
            buffer.load_state_dict(extra["group_buffer"])
        dedupe = extra.get("dedupe") or _window_of(result.ledger, buffer)
        if rehearsal is not None:
            rehearsal.load_state_dict(extra.get("rehearsal", {}))
        result.resumed_from = int(version.version)
        metrics.policy_version.set(policy_version)
        log.info("resumed from %s version %s (step %d)", model_name, version.version, policy.step)

    batcher = TransitionBatcher(settings, topic=topic, group_id=group_id, start_offsets=offsets,
                                stop_offsets=stop_offsets, dedupe=dedupe,
                                vocab_size=policy.vocab_size)
    batcher.counters.update(counters)
    metrics.watch(batcher.counters)
    store.start_run(f"learner-{learner.mode}-{int(time.time())}",
                    {"experiment": experiment, "mode": learner.mode,
                     "base_model": settings.base_model, "resumed_from": str(result.resumed_from)})
    started = time.monotonic()
    last_ckpt_t, last_ckpt_step = time.monotonic(), policy.step
    pending_offsets = dict(offsets or {})
    trained: list[list[dict]] = []  # the transitions of each step since the last checkpoint

    def checkpoint() -> None:
        nonlocal policy_version, last_ckpt_t, last_ckpt_step
        probe = policy.probe_loss()
        if not math.isfinite(probe):
            reject(probe)
        else:
            extra = {
                "offsets": pending_offsets, "policy_version": policy_version + 1,
                "ledger": _trim(result.ledger, learner.dedupe_window),
                "counters": dict(batcher.counters), "advantage": advantage.state_dict(),
                "group_buffer": buffer.state_dict() if buffer is not None else {},
                "dedupe": batcher.seen.state_dict(),
                "rehearsal": rehearsal.state_dict() if rehearsal is not None else {},
            }
            saved = store.save(policy, extra, step=policy.step, policy_version=policy_version + 1,
                               offsets=pending_offsets, metrics={**result.metrics,
                                                                 "probe_loss": probe},
                               group=batcher.group_metadata)
            policy_version += 1
            if store.fence is None:  # else committed with the registration
                batcher.commit(pending_offsets)  # only now: the version holding them is registered
            metrics.checkpointed(policy_version)
            result.checkpoints.append(saved)
            store.log_metrics({"register_s": saved.register_s, "probe_loss": probe}, policy.step)
        trained.clear()
        last_ckpt_t, last_ckpt_step = time.monotonic(), policy.step

    def reject(probe: float) -> None:
        """The policy is broken: drop what it learnt since the last checkpoint, and take the
        rehearsal back to where that checkpoint was, so its rows are trained again."""
        nonlocal policy
        lost = [t for step in trained for t in step]
        log.error("the policy at step %d scores %s on the probe set: not registered; the %d "
                  "transitions of its last %d steps go to the DLQ and the policy goes back to "
                  "the last registered checkpoint", policy.step, probe, len(lost), len(trained))
        metrics.rejected.inc()
        batcher.dead_letter(lost, "non_finite_probe",
                            f"the policy trained on it scored {probe} on the probe set")
        del result.ledger[len(result.ledger) - len(trained):]
        found = store.latest(work / f"restore-{time.time_ns()}")
        if found is None:
            policy = result.policy = PolicyTrainer(settings, work / "trl", ranks)
            extra = {}
        else:
            extra = policy.load(found[1])
        if rehearsal is not None:
            rehearsal.load_state_dict(extra.get("rehearsal", {}))

    def train(ready: list[dict]) -> None:
        weights = [t["_weight"] for t in ready]
        stale = [t["_staleness"] for t in ready]
        advantages = advantage.compute(ready)
        rehearsed = rehearsal.take() if rehearsal is not None else []
        step_started = time.monotonic()
        try:
            step_metrics = policy.train_step(ready + rehearsed, advantages + [1.0] * len(rehearsed),
                                             weights + [1.0] * len(rehearsed))
        except NonFiniteStep as exc:  # the demonstrations are not traffic: only it is lost
            log.warning("step skipped: %s; its %d transitions go to the DLQ", exc, len(ready))
            metrics.skipped.labels(reason=exc.reason).inc()
            batcher.dead_letter(ready, exc.reason, str(exc))
            if rehearsal is not None:
                rehearsal.put_back(rehearsed)
            return
        step_metrics["staleness"] = sum(stale) / len(stale)
        if rehearsed:  # the traffic's figures, not the demonstrations' ones and 1s
            step_metrics["mean_reward"] = sum(t["credited_return"] for t in ready) / len(ready)
            step_metrics["mean_advantage"] = sum(advantages) / len(advantages)
            step_metrics["rehearsed"] = float(len(rehearsed))
        metrics.stepped(len(ready), step_metrics, time.monotonic() - step_started)
        result.metrics = step_metrics
        result.steps += 1
        result.ledger.append([t["transition_id"] for t in ready + rehearsed])
        trained.append(ready)
        store.log_metrics(step_metrics, policy.step)
        if on_step:
            on_step(policy.step, {**step_metrics, "version": policy_version})

    try:
        if found is None and learner.warm_start is not None:
            warm_start_first(policy, result, store, metrics)
            checkpoint()
        while True:
            if stop is not None and stop.is_set():
                break
            if max_steps is not None and result.steps >= max_steps:
                break
            if until_step is not None and policy.step >= until_step:
                break
            if max_seconds is not None and time.monotonic() - started >= max_seconds:
                break
            timeout = learner.batch_timeout_s
            if max_seconds is not None:
                timeout = max(0.1, min(timeout, max_seconds - (time.monotonic() - started)))
            batch = batcher.next_batch(policy_version, timeout_s=timeout, stop=stop)
            if batch is None and batcher.exhausted and (buffer is None or not len(buffer)):
                break
            ready = []
            if batch is not None:
                for t, w, s in zip(batch.transitions, batch.weights, batch.staleness, strict=True):
                    t["_weight"], t["_staleness"] = w, s
                pending_offsets = batch.offsets
                ready = batch.transitions
            if buffer is not None:
                buffer.add(ready)
                ready = buffer.release(flush=batcher.exhausted)
            if ready:
                train(ready)
            elif ranks is not None:
                ranks.tell(("idle",))  # no step: the followers' wait for a command starts again
            due_steps = policy.step - last_ckpt_step >= learner.checkpoint_every_steps
            due_time = (learner.checkpoint_every_s is not None and policy.step > last_ckpt_step
                        and time.monotonic() - last_ckpt_t >= learner.checkpoint_every_s)
            if due_steps or due_time:
                checkpoint()
        if policy.step > last_ckpt_step:
            checkpoint()
        store.end_run()
    except BaseException:
        store.end_run("KILLED")
        raise
    finally:
        result.counters = Counter(batcher.counters)
        batcher.close()
        if ranks is not None:  # (a leader that fails earlier exits, and torchrun stops them)
            ranks.dismiss()
    return result


def warm_start_first(policy, result: LoopResult, store: CheckpointStore,
                     metrics: LearnerMetrics) -> None:
    """The warm start's steps (learner/warm_start.py), in the ledger like any step's."""
    learner = policy.learner
    for k, total, batch, step_metrics in warm_start.steps(
            policy, learner.warm_start, learner.warm_start_epochs, learner.warm_start_threads):
        metrics.stepped(len(batch), step_metrics, step_metrics.get("step_s", 0.0))
        if k == 1 or k == total or k % 10 == 0:
            log.info("warm start: step %d/%d, loss %.4f", k, total, step_metrics["loss"])
        store.log_metrics({f"warm_start_{name}": value for name, value in step_metrics.items()},
                          policy.step)
        result.steps += 1
        result.ledger.append([t["transition_id"] for t in batch])


def _window_of(ledger: list[list[str]], buffer: GroupBuffer | None) -> dict:
    """The dedupe window of a checkpoint written before it held one: its trained ids and the
    ones consumed before it and trained after it, with no emitted_ns known."""
    ids = [tid for step_ids in ledger for tid in step_ids]
    if buffer is not None:
        ids += [t["transition_id"] for g in buffer.groups.values() for t in g["items"]]
    return {"ids": ids, "emitted_ns": [0] * len(ids), "horizon_ns": 0}


def _trim(ledger: list[list[str]], window: int) -> list[list[str]]:
    kept, total = [], 0
    for ids in reversed(ledger):
        if total >= window:
            break
        kept.append(ids)
        total += len(ids)
    return kept[::-1]
