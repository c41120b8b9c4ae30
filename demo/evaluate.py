"""Held-out accuracy: the task's own agent, greedy, straight to an engine (not through the
gateway, so evaluation traffic never becomes training data).

    tracetrain eval --task calc --n 200 --seed 1000 --version 3     # demo/cli.py

`own_engine` starts an engine of its own on a free port, serving the base model or a registered
version (downloaded from MLflow as the reloader does), and stops it afterwards: eval works
whether the stack is up or not.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from demo.errors import DemoError
from infra import processes, services
from serving.reloader import Reloader
from serving.service import ENGINE
from tracetrain.settings import Settings

HELD_OUT_SEED = 1_000_003  # never used for training problems (see demo/traffic.py)


class EvalError(DemoError):
    """No version to evaluate, or the engine could not load it."""


@dataclass
class EvalResult:
    task: str
    version: str
    n: int
    accuracy: float
    rewards: list[float]
    metric: str = "accuracy"  # what `accuracy` is the mean of (rag: the answers' token F1)

    def summary(self) -> dict:
        return {"task": self.task, "version": self.version, "n": self.n,
                "accuracy": round(self.accuracy, 4), "metric": self.metric}


def accuracy(task, problems: list, base_url: str, threads: int = 8,
             on_done: Callable[[float], None] | None = None,
             episodes: list | None = None, system_prompt: str | None = None) -> list[float]:
    """Held-out scores of the task's agent on `problems` (its `metric`: the reward, rag's answer
    F1), greedy (temperature 0, fixed seeds). With `threads=1` the same engine state gives the
    same scores on every run. With more, llama.cpp batches whichever problems are running into
    one decode step, and its CPU kernels round differently for other batch sizes, so a
    borderline greedy answer can flip from run to run (CI saw 1 of 8 base-model problems do so).
    `on_done(score)` after each problem; with `episodes`, each problem's episode is appended to
    it (in the order they finish); `system_prompt` replaces the agent's own (calc)."""
    agent = task.agent(base_url, tracer=None, temperature=0.0, system_prompt=system_prompt)

    def one(item):
        index, problem = item
        episode = task.run(agent, problem, task_id=f"eval-{index}", seed=index)
        if episodes is not None:
            episodes.append(episode)
        value = task.score(episode)
        if on_done is not None:
            on_done(value)
        return value

    # Ctrl-C cancels what has not started (not left to the map iterator's clean-up) and does
    # not wait for the running ones: they end with the engine, which the caller stops.
    pool = ThreadPoolExecutor(max(1, threads))
    try:
        return list(pool.map(one, enumerate(problems)))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def with_progress(task, problems: list, base_url: str, label: str, threads: int = 8,
                  console=None, episodes: list | None = None,
                  system_prompt: str | None = None) -> list[float]:
    """`accuracy` with a rich progress bar (running accuracy in the description)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    done = {"n": 0, "sum": 0.0}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        job = bar.add_task(label, total=len(problems))

        def step(value: float) -> None:
            done["n"] += 1
            done["sum"] += value
            bar.update(job, advance=1,
                       description=f"{label} {task.metric} {done['sum'] / done['n']:.3f}")

        return accuracy(task, problems, base_url, threads, on_done=step, episodes=episodes,
                        system_prompt=system_prompt)


@contextlib.contextmanager
def own_engine(settings: Settings, version: int | None = None, alias: str | None = None,
               name: str = "eval-engine", slots: int | None = None) -> Iterator[tuple[str, str]]:
    """An engine on a free port serving the base model (neither version nor alias), a
    registered version or the version an alias points to, with `slots` parallel sequences
    (default: settings'). Yields (base_url, label)."""
    port = processes.free_port(settings.engine.host)
    engine = settings.engine.model_copy(update={"port": port,
                                                "slots": slots or settings.engine.slots})
    url = f"http://{engine.host}:{port}"
    reloader_cfg = settings.reloader.model_copy(update={"engine_url": url, "engine_urls": [], **(
        {"alias": alias} if alias else {})})
    settings = settings.model_copy(update={"engine": engine, "reloader": reloader_cfg})
    record = services.start(settings, ENGINE, instance=f"{name}-{port}")
    try:
        label = "base"
        if version is not None or alias is not None:
            with tempfile.TemporaryDirectory(prefix="tt-eval-") as folder:
                reloader = Reloader(settings, folder=Path(folder))
                target = reloader.version(version) if version is not None else reloader.target()
                if target is None:
                    raise EvalError(f"no version of {settings.mlflow.registered_model}@{alias} "
                                    f"in MLflow at {settings.mlflow.uri}")
                if not reloader.load(target):
                    raise EvalError(f"the engine could not load version {target.version}: "
                                    f"{reloader.state.last_error}")
                label = str(target.version)
        yield f"{url}/v1", label
    finally:
        services.stop(settings, record.name, timeout_s=10)
