"""One learner as N data-parallel ranks under `torchrun`: rank 0 leads, the others follow.

    torchrun --standalone --nproc-per-node 2 -m tracetrain.cli learner     # see README.md
    ranks = join(settings)          # None outside torchrun (WORLD_SIZE unset or 1)
    follow(settings, ranks)         # ranks 1..N-1: train what rank 0 says, until it says stop

Why rank 0 consumes and broadcasts, rather than each rank consuming its own partitions: the
exactly-once promise rests on ONE Kafka transaction per checkpoint (the consumed offsets, the
registration and its announcement, learner/fencing.py) and on ONE dedupe window, advantage
state and group buffer, all written in the checkpoint. With one consumer they stay exactly as
in a single-process learner: the leader's loop (learner/loop.py) is unchanged, a micro-batch
is the same whatever the number of ranks, and the advantages are computed over the whole
batch. Partitions per rank would need the offsets and windows gathered into each checkpoint,
every rank fenced, and batches that depend on how partitions fall on ranks. What the broadcast
costs is one pickled micro-batch (token ids, a few kB) per step, small beside the gradient
all-reduce.

So rank 0 alone talks to Kafka and MLflow (consumes, fences, checkpoints, registers, serves
/healthz); it tells the followers each command on a gloo group (`tell`): `build` a policy,
`step` on this batch, adopt this `state` (after a resume or a rejected policy), `idle`
(nothing arrived: the followers' wait starts again), `stop`. Every rank builds the same
`PolicyTrainer`, wrapped in torch's DistributedDataParallel, and trains on its rows of each
batch (`shard`); the all-reduce of gradients makes the step the single-process one.

With `learner.full_finetune` (`learner.dist_strategy` auto or fsdp) the model is sharded
instead (`shard_model`, FSDP2): each rank holds 1/N of the weights, gradients and Adam state,
and a forward all-gathers one decoder layer at a time. Then a forward or a full state dict is a
collective, so the leader's probe and checkpoint tell the followers to join it (`probe`,
`gather`); the checkpoint rank 0 writes is still the whole model, as one process writes it.

A rank that dies ends the job: torchrun's agent stops the others, and a collective with a
dead peer fails (gloo sees the closed connection; otherwise `learner.collective_timeout_s`).
A restarted job resumes from the last registered checkpoint, as a single process does: what
the dead job trained after it is trained again, once.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from learner.errors import LearnerError, NonFiniteStep
from tracetrain.settings import Settings

log = logging.getLogger("tracetrain.learner")


@dataclass
class Ranks:
    """This process's place in the job, and the group its commands travel on."""

    rank: int
    world: int
    local_rank: int
    control: object  # a gloo ProcessGroup: commands are Python objects on the CPU

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def shard(self, rows: int) -> tuple[int, int]:
        """This rank's rows [start, stop) of a batch of `rows` (contiguous, sizes differ by at
        most one; empty when the batch has fewer rows than ranks)."""
        return self.rank * rows // self.world, (self.rank + 1) * rows // self.world

    def tell(self, command: tuple) -> None:
        """Rank 0: send `command` to every follower."""
        dist.broadcast_object_list([command], src=0, group=self.control)

    def hear(self) -> tuple:
        """A follower: the leader's next command."""
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def total(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of `value` over the ranks (the default group: NCCL on GPUs)."""
        value = value.detach().clone()
        dist.all_reduce(value)
        return value

    def dismiss(self) -> None:
        """Rank 0, its loop over: the followers stop. A follower that died already (the
        reason the loop ended) cannot hear it; that is logged, not raised over the cause."""
        try:
            self.tell(("stop",))
        except Exception as exc:  # the job is ending either way
            log.warning("could not tell the other ranks to stop: %s", exc)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def shard_model(model, ranks: Ranks) -> None:
    """Shard `model` in place over the ranks with FSDP2: each decoder layer (the classes
    transformers names in `_no_split_modules`) is one unit, gathered for its own forward and
    backward only; the root unit keeps the rest (embeddings, final norm, a tied LM head). Its
    parameters become DTensors sharded on dim 0; build the optimizer after this."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mesh = init_device_mesh(device, (ranks.world,))
    units = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if type(module).__name__ in units:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def join(settings: Settings) -> Ranks | None:
    """This process's Ranks when torchrun (or `accelerate launch`) started several; None for a
    single process, whose behaviour stays exactly as without torch.distributed."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    learner = settings.learner
    if learner.mode != "rl":
        raise LearnerError(f"learner.mode {learner.mode!r} with WORLD_SIZE={world}: expected "
                           "'rl', the one mode whose loss is split across ranks exactly "
                           "(sft and kto run as one process)")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    backend = learner.dist_backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, timeout=timedelta(seconds=learner.collective_timeout_s))
    # Followers wait here between steps while the leader polls Kafka or waits out an outage,
    # which a training collective's timeout must not cover.
    control = dist.new_group(backend="gloo", timeout=timedelta(seconds=learner.follower_wait_s))
    log.info("rank %d of %d (%s), local rank %d", rank, world, backend, local_rank)
    return Ranks(rank, world, local_rank, control)


def follow(settings: Settings, ranks: Ranks) -> int:
    """A follower's whole life: do what rank 0 says until it says stop; the steps taken."""
    from learner.trainer import PolicyTrainer

    work = Path(tempfile.mkdtemp(prefix=f"tt-learner-rank{ranks.rank}-"))
    policy, steps = None, 0
    while True:
        command = ranks.hear()
        kind = command[0]
        if kind == "stop":
            log.info("rank %d: %d steps, stopping as rank 0 says", ranks.rank, steps)
            return steps
        if kind == "build":
            policy = PolicyTrainer(settings, work / "trl", ranks)
        elif kind == "state":
            policy.adopt(command[1])
        elif kind == "probe":  # sharded: the leader's probe forward needs every rank
            policy.probe_loss()
        elif kind == "gather":  # sharded: the leader's full state dict needs every rank
            policy.full_state()
        elif kind == "step":
            try:
                policy.train_step(*command[1:])
                steps += 1
            except NonFiniteStep:
                pass  # the leader skips it too, and dead-letters its transitions
        elif kind != "idle":
            raise LearnerError(f"rank {ranks.rank}: unknown command {kind!r} from rank 0")
