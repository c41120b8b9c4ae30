"""The `tracetrain` subcommands of the producers stage; `register` adds them to the main app."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the `tracetrain` app."""
