"""`python -m streams`: the same worker as `tracetrain streams`, settings from the environment."""

import typer

from streams.cli import streams

typer.run(streams)
