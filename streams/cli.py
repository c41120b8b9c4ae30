"""`tracetrain streams` (also `python -m streams`): one real Faust worker of the rollout join."""

from __future__ import annotations

import typer


def streams(
    max_seconds: float = typer.Option(None, help="Stop after this many seconds (default: run until stopped)."),
    loglevel: str = typer.Option("WARNING", help="Faust/worker log level."),
) -> None:
    """Run one Faust worker: AIR deriver + rollout join of spans, rewards and air into
    credit-assigned transitions (bad records to the DLQ). Start several to share partitions."""
    from streams.app import run_worker
    from tracetrain.settings import get_settings

    run_worker(get_settings(), max_seconds, loglevel)
