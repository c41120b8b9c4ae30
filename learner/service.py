"""The learner stage's process, declared once: the continuous trainer.

    tracetrain up --services learner
"""

from __future__ import annotations

from infra.services import Service, cli

LEARNER = Service(
    name="learner",
    summary="micro-batches of transitions, a TRL step each, checkpoints registered in MLflow",
    reads=("transitions",),
    writes=("MLflow runs and model versions", "checkpoints", "dlq"),
    argv=lambda s: cli("learner"),
    listen=lambda s: None,
    health_url=lambda s: None,
    start_timeout_s=lambda s: 60.0,
)
