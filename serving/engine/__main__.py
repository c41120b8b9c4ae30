"""`python -m serving.engine`: the same engine as `tracetrain engine`, settings from the
environment."""

import typer

from serving.cli import engine

typer.run(engine)
