"""`tracetrain learner` (the continuous trainer) and `tracetrain replay` (retrain from history);
`register` adds them to the main app; the `learner` stack service runs the first detached.

    tracetrain learner --max-steps 100
    tracetrain replay --topic transitions --from 0 --experiment retry-lr --lr 5e-4
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path

import typer

from infra import processes
from infra.stack import register_service
from tracetrain.settings import settings_env


def start_service(settings) -> processes.ProcessRecord:
    """Run `tracetrain learner` detached (`tracetrain up --services learner`, the demo)."""
    argv = [sys.executable, "-m", "tracetrain.cli", "learner"]
    return processes.spawn(settings.home_dir, "learner", argv, address="-",
                           env=settings_env(settings),
                           cwd=Path.cwd())


register_service("learner", start_service)


class _Progress:
    """A rich live line on a terminal; plain log lines otherwise."""

    def __init__(self, total: int | None):
        self.tty = sys.stdout.isatty()
        self.total = total
        self._bar = None
        if self.tty:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("step {task.completed}"), BarColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn())
            self._task = self._bar.add_task("learner", total=total, info="waiting for batches")

    def __enter__(self):
        if self._bar:
            self._bar.start()
        return self

    def __exit__(self, *exc):
        if self._bar:
            self._bar.stop()

    def __call__(self, step: int, m: dict) -> None:
        # a step of `sft` with no example above the threshold reports fewer metrics
        nan = float("nan")
        if m.get("skipped"):
            info = f"v{m['version']} batch skipped: nothing trainable in this mode"
        else:
            info = (f"v{m['version']} loss {m.get('loss', nan):.4f} "
                    f"reward {m.get('mean_reward', nan):.3f} "
                    f"{m.get('transitions_per_s', nan):.1f} tr/s {m.get('tokens_per_s', nan):.0f} tok/s")
        if self._bar:
            self._bar.update(self._task, completed=step, info=info)
        else:
            logging.getLogger("tracetrain.learner").info("step %d %s", step, info)


def _apply(settings, mode: str | None, lr: float | None, seed: int | None):
    update = {k: v for k, v in {"mode": mode, "lr": lr, "seed": seed}.items() if v is not None}
    if not update:
        return settings
    from learner.config import LearnerSettings

    section = LearnerSettings.model_validate({**settings.learner.model_dump(), **update})
    return settings.model_copy(update={"learner": section})


def _report(result, started: float) -> None:
    out = {"steps": result.steps, "resumed_from": result.resumed_from,
           "versions": [c.version for c in result.checkpoints],
           "counters": dict(result.counters), "seconds": round(time.time() - started, 1)}
    typer.echo(json.dumps(out))


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the `tracetrain` app."""

    @app.command("learner")
    def learner(
        max_steps: int = typer.Option(None, help="Stop after this many training steps."),
        until_step: int = typer.Option(None, help="Stop once the policy reached this step "
                                       "(counting steps of the checkpoint it resumed from)."),
        max_seconds: float = typer.Option(None, help="Stop after this many seconds."),
        experiment: str = typer.Option(None, help="MLflow experiment (default: settings)."),
        mode: str = typer.Option(None, help="rl, sft or kto (default: settings)."),
    ) -> None:
        """Train continuously from the transitions topic: micro-batches, TRL step, checkpoints
        registered in MLflow (alias `latest`), offsets committed after registration. Resumes
        from the experiment's newest checkpoint."""
        from learner.loop import run_learner
        from tracetrain.settings import get_settings

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        settings = _apply(get_settings(), mode, None, None)
        started = time.time()
        # SIGTERM (`tracetrain down`, the demo's stop) ends the loop between batches, so the
        # last steps are checkpointed and registered instead of lost.
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with _Progress(max_steps) as progress:
            result = run_learner(settings, experiment=experiment, max_steps=max_steps,
                                 until_step=until_step, max_seconds=max_seconds,
                                 on_step=progress, stop=stop)
        _report(result, started)

    @app.command("replay")
    def replay(
        topic: str = typer.Option("transitions", help="`transitions` (or a full topic name); "
                                  "`spans` re-runs stream processing first."),
        start: str = typer.Option(..., "--from", help="Offset (digits) or ISO 8601 timestamp."),
        end: str = typer.Option(None, "--to", help="Offset or timestamp (default: the end now)."),
        experiment: str = typer.Option(..., help="The new MLflow experiment to train into."),
        mode: str = typer.Option(None, help="rl, sft or kto (default: settings)."),
        lr: float = typer.Option(None, help="Learning rate (default: settings)."),
        seed: int = typer.Option(None, help="Seed (default: settings); same seed, same model."),
        max_steps: int = typer.Option(None, help="Stop after this many steps."),
    ) -> None:
        """Train a new experiment from a range of history with its own consumer group; the
        live learner and its model's aliases are not touched."""
        from learner.errors import LearnerError
        from learner.replay import replay as run_replay
        from tracetrain.settings import get_settings

        settings = _apply(get_settings(), mode, lr, seed)
        if topic == "spans":
            raise LearnerError(
                "replay --topic spans needs the streams stage to re-run credit assignment into a "
                "new transitions topic; that entry point does not exist yet. Re-run "
                "`tracetrain streams` with the new settings into another topic prefix, then "
                "`tracetrain replay --topic <prefix>.transitions`")
        name = settings.topics.transitions if topic == "transitions" else topic
        started = time.time()
        with _Progress(max_steps) as progress:
            result = run_replay(settings, experiment=experiment, start=start, end=end,
                                topic=name, max_steps=max_steps, on_step=progress)
        _report(result, started)
