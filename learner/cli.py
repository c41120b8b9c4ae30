"""`tracetrain learner` (the continuous trainer) and `tracetrain replay` (retrain from history).
`learner/service.py` declares the learner's detached form (`tracetrain up --services learner`).

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

import typer

from tracetrain.modes import CREDIT_MODES, LEARNER_MODES, one_of


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
    from tracetrain.settings.learner import LearnerSettings

    section = LearnerSettings.model_validate({**settings.learner.model_dump(), **update})
    return settings.model_copy(update={"learner": section})


def _report(result, started: float) -> None:
    out = {"steps": result.steps, "resumed_from": result.resumed_from,
           "versions": [c.version for c in result.checkpoints],
           "counters": dict(result.counters), "seconds": round(time.time() - started, 1)}
    typer.echo(json.dumps(out))


def learner(
    max_steps: int = typer.Option(None, help="Stop after this many training steps."),
    until_step: int = typer.Option(None, help="Stop once the policy reached this step "
                                   "(counting steps of the checkpoint it resumed from)."),
    max_seconds: float = typer.Option(None, help="Stop after this many seconds."),
    experiment: str = typer.Option(None, help="MLflow experiment (default: settings)."),
    mode: str = typer.Option(None, help=f"{one_of(LEARNER_MODES)} (default: settings)."),
) -> None:
    """Train continuously from the transitions topic: micro-batches, TRL step, checkpoints
    registered in MLflow (alias `latest`), offsets committed after registration. Resumes
    from the experiment's newest checkpoint. Under `torchrun --nproc-per-node N` the N
    processes are one data-parallel learner (rank 0 consumes, checkpoints and registers)."""
    from learner.distributed import follow, join
    from learner.loop import run_learner
    from learner.metrics import LearnerMetrics, serve_status
    from tracetrain.observability import configure_logging
    from tracetrain.settings import get_settings

    configure_logging("INFO")
    settings = _apply(get_settings(), mode, None, None)
    started = time.time()
    # SIGTERM (`tracetrain down`, the demo's stop, torchrun stopping the job) ends the loop
    # between batches, so the last steps are checkpointed and registered instead of lost; the
    # other ranks of a torchrun job go on until rank 0 says stop, so its last steps can finish.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ranks = join(settings)
    try:
        if ranks is not None and not ranks.leader:
            follow(settings, ranks)
            return
        metrics = LearnerMetrics()  # /metrics, /healthz, /state on learner.metrics_port
        with _Progress(max_steps) as progress, serve_status(settings.learner, metrics):
            result = run_learner(settings, experiment=experiment, max_steps=max_steps,
                                 until_step=until_step, max_seconds=max_seconds,
                                 on_step=progress, stop=stop, metrics=metrics, ranks=ranks)
    finally:
        if ranks is not None:
            ranks.close()
    _report(result, started)

def replay(
    topic: str = typer.Option("transitions", help="`transitions` (or a full topic name); "
                              "`spans` re-runs stream processing first."),
    start: str = typer.Option(..., "--from", help="Offset (digits) or ISO 8601 timestamp."),
    end: str = typer.Option(None, "--to", help="Offset or timestamp (default: the end now)."),
    experiment: str = typer.Option(..., help="The new MLflow experiment to train into."),
    mode: str = typer.Option(None, help=f"{one_of(LEARNER_MODES)} (default: settings)."),
    lr: float = typer.Option(None, help="Learning rate (default: settings)."),
    seed: int = typer.Option(None, help="Seed (default: settings); same seed, same model."),
    max_steps: int = typer.Option(None, help="Stop after this many steps."),
    credit: str = typer.Option(None, help=f"--topic spans: credit assignment, {one_of(CREDIT_MODES)} "
                               "(default: settings.streams.credit)."),
    gamma: float = typer.Option(None, help="--topic spans: discount of `discounted`."),
    air_rule: list[str] = typer.Option(None, "--air-rule", help="--topic spans: NAME=VALUE "
                                       "for an AIR rule (repeatable; 0 disables a rule), e.g. "
                                       "tool_ok=0.2."),
    no_train: bool = typer.Option(False, "--no-train", help="--topic spans: only rebuild the "
                                  "transitions topic; print its name."),
) -> None:
    """Train a new experiment from a range of history with its own consumer group; the
    live learner and its model's aliases are not touched. `--topic spans` first re-runs
    the stream processing of that range with other reward shaping (--credit, --gamma,
    --air-rule) into `<prefix>-replay-<experiment>.transitions`, then trains from it."""
    from learner.replay import replay as run_replay
    from learner.replay import replay_spans
    from tracetrain.settings import get_settings

    settings = _apply(get_settings(), mode, lr, seed)
    shaping = {"credit": credit, "gamma": gamma, "air_rule": air_rule, "no_train": no_train}
    if topic != "spans" and any(v not in (None, False, []) for v in shaping.values()):
        raise typer.BadParameter("--credit, --gamma, --air-rule and --no-train re-shape "
                                 "rewards: they need --topic spans", param_hint="--topic")
    started = time.time()
    if topic == "spans":
        update = _streams_update(settings, credit, gamma, air_rule or [])
        with _Progress(max_steps) as progress:
            rebuilt, result = replay_spans(
                settings, experiment=experiment, start=start, end=end, streams_update=update,
                train=not no_train, on_copy=_CopyCount(), max_steps=max_steps,
                on_step=progress)
        typer.echo(json.dumps(rebuilt.summary()), err=result is not None)
        if result is not None:
            _report(result, started)
        return
    name = settings.topics.transitions if topic == "transitions" else topic
    with _Progress(max_steps) as progress:
        result = run_replay(settings, experiment=experiment, start=start, end=end,
                            topic=name, max_steps=max_steps, on_step=progress)
    _report(result, started)


class _CopyCount:
    """A log line every 10,000 records copied by `replay --topic spans`."""

    def __init__(self):
        self.count = 0

    def __call__(self, short: str) -> None:
        self.count += 1
        if self.count % 10_000 == 0:
            typer.echo(f"replay: {self.count} records read ({short})", err=True)


def _streams_update(settings, credit: str | None, gamma: float | None, rules: list[str]) -> dict:
    """The streams settings a spans replay changes, validated now (not in the worker)."""
    from pydantic import ValidationError

    from tracetrain.settings.streams import AirRuleSettings, StreamsSettings

    air = settings.streams.air_rules.model_dump()
    for rule in rules:
        name, sep, value = rule.partition("=")
        if not sep or name not in AirRuleSettings.model_fields:
            raise typer.BadParameter(f"{rule!r}: expected NAME=VALUE with NAME one of "
                                     f"{', '.join(AirRuleSettings.model_fields)}",
                                     param_hint="--air-rule")
        air[name] = value
    update = {k: v for k, v in {"credit": credit, "gamma": gamma}.items() if v is not None}
    update["air_rules"] = air
    try:
        checked = StreamsSettings.model_validate({**settings.streams.model_dump(), **update})
    except ValidationError as exc:
        raise typer.BadParameter("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                           for e in exc.errors()), param_hint="--credit/--gamma/--air-rule") from exc
    return {"credit": checked.credit, "gamma": checked.gamma,
            "air_rules": checked.air_rules.model_dump()}
