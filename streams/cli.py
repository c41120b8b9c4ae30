"""The `tracetrain streams` command (a real Faust worker of the rollout join) and the
`streams` stack service (`tracetrain up --services streams`)."""

from __future__ import annotations

import typer

from infra.stack import register_service


def _start_service(settings):
    from streams.process import start_worker

    return start_worker(settings, name="streams")


register_service("streams", _start_service)


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the `tracetrain` app."""

    @app.command("streams")
    def streams(
        max_seconds: float = typer.Option(None, help="Stop after this many seconds (default: run until stopped)."),
        loglevel: str = typer.Option("WARNING", help="Faust/worker log level."),
    ) -> None:
        """Run one Faust worker: AIR deriver + rollout join of spans, rewards and air into
        credit-assigned transitions (bad records to the DLQ). Start several to share partitions."""
        from streams.app import run_worker
        from tracetrain.settings import get_settings

        run_worker(get_settings(), max_seconds, loglevel)
