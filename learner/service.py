"""The learner stage's process, declared once: the continuous trainer.

    tracetrain up --services learner
"""

from __future__ import annotations

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
