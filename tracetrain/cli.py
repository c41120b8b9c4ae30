"""`tracetrain`: the one console script in front of every process.

    tracetrain --help

This module is the process entry point, the one place above every stage: it lists each
command explicitly, with the module that holds it. Settings are built once by the command
that runs, at process start, and invalid ones fail before anything runs.
"""

from __future__ import annotations

import sys

import typer

from demo import cli as demo_cli
from infra import cli as stack_cli
from learner import cli as learner_cli
from optimizer import cli as optimizer_cli
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

# The local stack (infra/cli.py)
app.command("up")(stack_cli.up)
app.command("down")(stack_cli.down)
app.command("status")(stack_cli.status)
app.command("smoke")(stack_cli.smoke)
app.add_typer(stack_cli.kafka_app, name="kafka")
app.add_typer(stack_cli.topics_app, name="topics")
# One command per pipeline stage, in the order data flows
app.command("gateway")(producers_cli.gateway)
app.command("streams")(streams_cli.streams)
app.command("learner")(learner_cli.learner)
app.command("replay")(learner_cli.replay)
app.command("engine")(serving_cli.engine)
app.command("reloader")(serving_cli.reloader)
# The closed loop (demo/cli.py)
app.command("demo")(demo_cli.demo)
app.command("eval")(demo_cli.eval_command)
# Beside the learner: the agent's system prompt instead of its weights (optimizer/cli.py)
app.command("optimize-prompt")(optimizer_cli.optimize_prompt)


def main() -> None:
    try:
        app()
    except TracetrainError as exc:
        # Our errors already say what was wrong and how to fix it: no traceback.
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
