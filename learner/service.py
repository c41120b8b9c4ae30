"""The learner stage's process, declared once: the continuous trainer.

    tracetrain up --services learner
    tracetrain up --profile production       # `learner_job(2)`: 2 ranks under torchrun
"""

from __future__ import annotations

import sys
from dataclasses import replace

from infra.services import Service, cli, status_address

LEARNER = Service(
    name="learner",
    summary="micro-batches of transitions, a TRL step each, checkpoints registered in MLflow",
    reads=("transitions",),
    writes=("MLflow runs and model versions", "checkpoints", "dlq"),
    argv=lambda s: cli("learner"),
    listen=lambda s: status_address(s.learner.metrics_host, s.learner.metrics_port),
    health_path="/healthz",
    start_timeout_s=lambda s: 60.0,
    port_setting="learner.metrics_port",
)


def learner_job(ranks: int) -> Service:
    """The learner as one torchrun job of `ranks` processes on this machine (gloo on CPUs):
    rank 0 consumes, checkpoints and registers, and serves the status port. Supervised: a rank
    that dies ends the job (torchrun stops the others), and the supervisor starts the job again,
    which resumes from the newest checkpoint. Loading the model in every rank takes longer."""
    return replace(
        LEARNER,
        summary=f"{LEARNER.summary}; {ranks} data-parallel ranks under torchrun",
        argv=lambda s: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(ranks), "-m", "tracetrain.cli", "learner"],
        start_timeout_s=lambda s: 300.0,
        restart=True,
    )
