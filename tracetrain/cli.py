"""`tracetrain`: the one console script in front of every process.

    tracetrain --help

The local stack (kafka, topics, up, down, status) is defined in `infra/cli.py`; each stage
adds its own commands from `STAGE/cli.py` (gateway, streams, learner, engine, reloader, ...);
the closed loop (demo, eval) is `demo/cli.py`.
Settings are built once here, at process start, and invalid ones fail before anything runs.
"""

from __future__ import annotations

import sys

import typer

from demo import cli as demo_cli
from infra import cli as infra_cli
from learner import cli as learner_cli
from producers import cli as producers_cli
from serving import cli as serving_cli
from streams import cli as streams_cli
from tracetrain.errors import TracetrainError

app = typer.Typer(
    name="tracetrain",
    help="Agents that learn from their own traffic: spans on Kafka, Faust joins, a TRL "
    "learner, MLflow checkpoints and hot-reloading engines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

for stage in (infra_cli, producers_cli, streams_cli, learner_cli, serving_cli, demo_cli):
    stage.register(app)


def main() -> None:
    try:
        app()
    except TracetrainError as exc:
        # Our errors already say what was wrong and how to fix it: no traceback.
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
