"""The learner stage's process, declared once: the continuous trainer.

    tracetrain up --services learner
"""

from __future__ import annotations

from infra.services import Service, cli
from tracetrain.settings import Settings


def _status(s: Settings) -> tuple[str, int] | None:
    """Where `tracetrain learner` serves /healthz; None for metrics_port 0 (a free port, for
    tests), which cannot be known before it starts: then it is ready once spawned."""
    return (s.learner.metrics_host, s.learner.metrics_port) if s.learner.metrics_port else None


def _health(s: Settings) -> str | None:
    bound = _status(s)
    return f"http://{bound[0]}:{bound[1]}/healthz" if bound else None


LEARNER = Service(
    name="learner",
    summary="micro-batches of transitions, a TRL step each, checkpoints registered in MLflow",
    reads=("transitions",),
    writes=("MLflow runs and model versions", "checkpoints", "dlq"),
    argv=lambda s: cli("learner"),
    listen=_status,
    health_url=_health,
    start_timeout_s=lambda s: 60.0,
)
