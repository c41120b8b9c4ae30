"""`tracetrain demo`: the whole loop on this machine, start to finish.

1. Kafka and MLflow (reused if this state folder already runs them), this run's topics
   (prefix `<prefix>-demo-<run>`), the engine serving the base model.
2. Held-out accuracy of the base model (greedy, straight to the engine; cached per model,
   task, problems and agent, since greedy decoding of the same model gives the same answers).
3. The Faust worker, the gateway in front of the engine, the learner and the reloader; for
   calc, the learner's warm start on worked problems of the training phrasings, served as
   version 1 before any traffic (learner/warm_start.py); then the agent workers: rollouts
   through the gateway, rewards from the tracer.
4. A live dashboard for `minutes`; a small held-out evaluation at each new served version.
5. Stop the agents and the learner (its last steps are registered), wait for the reloader to
   serve the last version, held-out accuracy of it on the same problems as the base.
6. `home/demo/<run>/summary.json` and `reward_curve.png`, the MLflow address; everything this
   run started is stopped, whatever happened. `<run>` is the start time and the mode, and the
   versions the reloader downloads stay in `home/demo/<run>/versions/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console

from demo import evaluate, report
from demo.dashboard import live_view
from demo.monitor import HeldOut, Monitor
from demo.tasks import Task, get_task
from demo.traffic import Traffic
from examples.calc import agent as calc_agent
from examples.rag import agent as rag_agent
from examples.sql import agents as sql_agents
from infra import mlflow_server, processes, services, stack, topics
from infra.kafka import broker
from serving.service import engine_url
from tracetrain.errors import TracetrainError
from tracetrain.settings import Settings
from tracetrain.settings.learner import LORA_ALL_LINEAR


@dataclass(frozen=True)
class DemoOptions:
    task: str = "calc"
    front_end: str = "openai"
    minutes: float = 10.0
    # Tuned for the llama-server engine on 2 cores (issue 19): 16 agents keep 16 slots busy
    # (continuous batching: decode runs ~1.4x faster at 16 sequences than at 8). The engine and
    # the learner get one thread each: llama.cpp's threads meet at a spinning barrier every
    # layer, so two of them beside a busy learner thread decode at 72 tokens/s where one
    # alone does 127 (llama-batched-bench, 16 sequences, one core kept busy).
    workers: int = 16
    slots: int = 16
    mode: str = "sft"
    n_eval: int = 200
    version_eval_n: int = 32
    group_size: int = 4
    temperature: float = 0.3
    lr: float = 3e-4
    checkpoint_every: int = 3  # learner steps per registered version
    learner_threads: int | None = 1
    engine_threads: int | None = 1
    # Problems worked as demonstrations for the learner's warm start before any traffic (its
    # version is served first); None: the task's default (WARM_START).
    warm_start: int | None = None
    # The LoRA's layers: with all seven linear ones (and the longer warm start) the default
    # run ended at 0.420 and 0.405 held-out, against 0.340 with q/v (README, the demo), for
    # 11% more time a step.
    lora_targets: tuple[str, ...] = LORA_ALL_LINEAR
    # Demonstrations trained in every traffic step beside it (learner/rehearsal.py); None: the
    # task's default (REHEARSAL), 0: none.
    rehearsal: int | None = None
    # How calc's plain agent solves (examples/calc/agent.py); None: its default (expression).
    calc_style: str | None = None
    # Minutes the whole run may take: the traffic ends early where the start-up and the warm
    # start took so long that its full `minutes` and the finish (FINISH_RESERVE_S) would
    # overrun them; None: the traffic always runs its `minutes` (`tracetrain demo` gives 30
    # with its default minutes).
    within: float | None = None

    @property
    def warm_start_problems(self) -> int:
        if self.warm_start is not None:
            return self.warm_start
        default = WARM_START.get((self.task, self.front_end), 0)
        # `sft` and `rl`'s warm start run a batch's shared prompt once
        # (learner/shared_prefix.py): `kto`'s loss runs every row whole, and 1300 would not
        # end within 30 minutes
        return default if self.mode != "kto" else min(default, WARM_START_WHOLE_ROWS)

    @property
    def rehearsal_per_step(self) -> int:
        return REHEARSAL.get((self.task, self.front_end), 0) if self.rehearsal is None \
            else self.rehearsal


# Calc's base model solves 1.5% of its problems: too few successes for `sft` to imitate or
# for `rl` groups to tell apart. Worked problems first (learner/warm_start.py): one pass over
# 300 at 1e-3 took held-out accuracy to 0.395 (q/v LoRA) or 0.425 (all linear layers, rank 16;
# 2 threads, 11-12 minutes). The warm start does most of the demo's learning: trained call by
# call, 250 took 12-13 of its 30 minutes (measured beside the idle engine); a problem's two calls
# trained as one sequence cost about half (learner/warm_start.py): 450 took 9.7-10.8 (three
# runs, README), and traffic the last 10. With the batch's shared prompt run once
# (learner/shared_prefix.py) 1000 take 7.8 minutes, and the runs with them ended at 0.585 held-out
# (runs 20 and 21, README) where 450 ended at 0.46-0.47; 1300 ended at 0.645-0.660 (runs 22-24),
# and take about 10 minutes on a machine doing nothing else. A cosine rate (a rise, a peak of
# 2e-3, a fall to a tenth: learner/warm_start.py `rate`) took 1300 alone to 0.680 (run 25),
# where the constant 1e-3 had ended at 0.645-0.660 with ten minutes of traffic after it. 1600
# at the same rate did no better (0.640 alone, 0.620 after the 3.7 minutes of traffic --within
# left them: run 26, a slow hour, 18.1 minutes of warm start), so 1300 stay.
WARM_START = {("calc", "openai"): 1300}
WARM_START_WHOLE_ROWS = 450  # the default where the learner's loss runs every row whole
# Stopping the learner, serving its last version and the final evaluation (n=200): 3.1-3.3
# minutes in runs 21 and 23, 4.1 in run 24 on a slower hour of this 2-core machine.
FINISH_RESERVE_S = 300.0
WARM_START_LR = 2e-3
WARM_START_SCHEDULE = "cosine"
WARM_START_SEED = 500_009  # neither a traffic round's seed (demo/traffic.py) nor the held-out one
# Rehearsal (learner/rehearsal.py): other worked problems than the warm start's, 4 in every
# traffic step. Without it the traffic moved held-out accuracy by +0.004, +0.005 and -0.080 from
# the warm start's (three runs); with it by +0.005 and +0.015 (README, the demo). 300 problems
# outlast the ~35 traffic steps of a 10-minute run (a step takes each once before any comes back).
REHEARSAL = {("calc", "openai"): 4}
REHEARSAL_PROBLEMS = 300
REHEARSAL_SEED = 500_021


def demo_settings(settings: Settings, opts: DemoOptions, task: Task, run_id: str) -> Settings:
    """This run's own topics, experiment and registered model, so that a second run starts from
    the base model and never trains on the first one's transitions."""
    learner = settings.learner.model_copy(update={
        "mode": opts.mode, "lr": opts.lr, "group_size": opts.group_size,
        "lora_targets": list(opts.lora_targets),
        "batch_timeout_s": 20.0, "group_wait_s": 30.0, "checkpoint_every_steps": opts.checkpoint_every,
        "staleness_policy": "downweight", "threads": opts.learner_threads,
        # no traffic runs until the warm start's version is served: it may take every core
        **({"warm_start": warm_start_file(settings, run_id), "warm_start_lr": WARM_START_LR,
            "warm_start_schedule": WARM_START_SCHEDULE,
            "warm_start_threads": os.cpu_count()} if opts.warm_start_problems else {}),
        **({"rehearsal": rehearsal_file(settings, run_id),
            "rehearsal_per_step": opts.rehearsal_per_step} if opts.rehearsal_per_step else {})})
    engine = settings.engine.model_copy(update={"threads": opts.engine_threads,
                                                "slots": opts.slots})
    streams = settings.streams.model_copy(update={
        "select_agents": task.trained_agents, "idle_timeout_s": 60.0})
    mlflow = settings.mlflow.model_copy(update={
        "experiment": f"demo-{task.name}-{run_id}",
        "registered_model": f"demo-{task.name}-{run_id}"})
    topic_cfg = settings.topics.model_copy(update={"prefix": f"{settings.topics.prefix}-demo-{run_id}"})
    # The demo runs one engine of its own: a pool set for the stack is not the demo's.
    gateway = settings.gateway.model_copy(update={
        "upstream_url": f"{engine_url(settings)}/v1", "upstream_urls": []})
    # The run's downloads stay with the run (the reloader keeps them per registered model)
    reloader = settings.reloader.model_copy(update={
        "download_dir": settings.home_dir / "demo" / run_id / "versions", "engine_urls": []})
    return settings.model_copy(update={"learner": learner, "engine": engine, "streams": streams, "mlflow": mlflow,
                                       "topics": topic_cfg, "gateway": gateway, "reloader": reloader})


def traffic_ends_at(t0: float, train_started: float, opts: DemoOptions) -> float:
    """When the traffic stops: `opts.minutes` after it started, or earlier where the run,
    started at `t0`, would otherwise not end within `opts.within` minutes (never before the
    traffic started: then there is none)."""
    planned = train_started + opts.minutes * 60
    if opts.within is None:
        return planned
    return max(train_started, min(planned, t0 + opts.within * 60 - FINISH_RESERVE_S))


def warm_start_file(settings: Settings, run_id: str) -> Path:
    return settings.home_dir / "demo" / run_id / "warm_start.jsonl"


def rehearsal_file(settings: Settings, run_id: str) -> Path:
    return settings.home_dir / "demo" / run_id / "rehearsal.jsonl"


def _base_cache_key(settings: Settings, task: Task, problems: list) -> str:
    agent = json.dumps([*calc_agent.STYLES[task.style], sql_agents.PROMPTS,
                        sql_agents.DEMONSTRATIONS, task.max_tokens])
    if task.name == "rag":  # calc's and sql's keys stay as they were
        agent += json.dumps([rag_agent.SYSTEM_PROMPT, rag_agent.DEMONSTRATION])
    if task.front_end != "openai":
        agent += f"|{task.front_end}"
    # the questions themselves, not the seed and count: a changed generator is a new problem set
    questions = hashlib.sha256(json.dumps([p.question for p in problems]).encode()).hexdigest()
    raw = f"{settings.base_model}|{task.name}|{questions}|{agent}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


class DemoRun:
    def __init__(self, settings: Settings, opts: DemoOptions, console: Console):
        self.opts, self.console, self.task = opts, console, get_task(
            opts.task, opts.front_end, opts.calc_style)
        # the mode too: `--compare` starts runs back to back, and two of them must never
        # share a folder, topics or a registered model
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{opts.mode}"
        self.settings = demo_settings(settings, opts, self.task, self.run_id)
        self.folder = self.settings.home_dir / "demo" / self.run_id
        self.folder.mkdir(parents=True, exist_ok=True)
        self.started: list[str] = []  # process names this run started, stopped at the end
        self.engine_url = engine_url(self.settings)
        self.heldout_problems = self.task.problems(opts.n_eval, evaluate.HELD_OUT_SEED, self.folder,
                                                   split="heldout")
        # written now: a task without demonstrations fails at once
        for count, seed, path in ((opts.warm_start_problems, WARM_START_SEED, warm_start_file),
                                  (opts.rehearsal_per_step and REHEARSAL_PROBLEMS, REHEARSAL_SEED,
                                   rehearsal_file)):
            if count:
                rows = self.task.demonstrations(count, seed)
                path(settings, self.run_id).write_text("".join(json.dumps(row) + "\n"
                                                               for row in rows))

    # -- the stack ----------------------------------------------------------------------------
    def _say(self, text: str) -> None:
        self.console.print(f"[bold cyan]demo[/] {text}")

    def _up(self, what: str, name: str) -> None:
        self._say(f"starting {what} ...")
        records: list = []
        try:  # what runs is stopped at the end even if the start is cut short (Kafka's topics)
            stack.up(self.settings, [name], started=records)
        finally:
            self.started += [record.name for record in records]

    def bring_up(self) -> None:
        """Kafka and MLflow are reused when this state folder (or settings) already has them;
        everything is started through `infra.stack.up`, as `tracetrain up` does."""
        s = self.settings
        if processes.port_in_use("127.0.0.1", s.kafka.port) or s.kafka.bootstrap_servers != \
                broker.bootstrap(s.kafka, s.kafka.brokers):
            self._say(f"reusing the running Kafka at {s.kafka.bootstrap_servers}")
            topics.create_topics(s.kafka.bootstrap_servers, s.topics)
        else:
            self._up("Kafka (KRaft, loopback)", "kafka")  # creates this run's topics too
        if s.mlflow.tracking_uri or mlflow_server.is_healthy(s.mlflow):
            self._say(f"reusing the MLflow server at {s.mlflow.uri}")
        else:
            self._up("the MLflow server", "mlflow")
        self._up("the engine (base model)", "engine")

    def start_pipeline(self) -> None:
        for what, name in (("the Faust worker", "streams"), ("the gateway", "gateway"),
                           ("the learner", "learner"), ("the reloader", "reloader")):
            self._up(what, name)

    def _check_alive(self) -> None:
        """A process of the loop that died ends the demo with its log, not a frozen dashboard."""
        for name in self.started:
            record = processes.read_record(self.settings.home_dir, name)
            if record is not None and not processes.pid_alive(record.pid):
                raise TracetrainError(f"{name} exited during the demo; see {record.log}")

    def stop_all(self) -> None:
        # Stages first, then MLflow, then Kafka; only what this run started (a reused Kafka
        # or MLflow stays up). The learner gets time to register its last steps.
        for name in reversed(self.started):
            services.stop(self.settings, name, timeout_s=30 if name == "learner" else 10)

    # -- evaluation ---------------------------------------------------------------------------
    def base_accuracy(self) -> tuple[float, bool]:
        key = _base_cache_key(self.settings, self.task, self.heldout_problems)
        cache = self.settings.home_dir / "demo" / "base-eval" / f"{key}.json"
        if cache.is_file():
            return json.loads(cache.read_text())["accuracy"], True
        rewards = evaluate.with_progress(self.task, self.heldout_problems, f"{self.engine_url}/v1",
                                         "held-out, base model", threads=self.opts.slots,
                                         console=self.console)
        value = sum(rewards) / len(rewards)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"accuracy": value, "n": len(rewards)}))
        return value, False

    def _version_evals(self, monitor: Monitor, stop: threading.Event) -> None:
        """A small held-out check whenever the engine serves a version not checked yet."""
        checked: set[int] = {0}
        problems = self.heldout_problems[:self.opts.version_eval_n]
        while not stop.is_set():
            version = monitor.snapshot.policy_version
            if version is not None and version not in checked:
                checked.add(version)
                rewards = evaluate.accuracy(self.task, problems, f"{self.engine_url}/v1",
                                            threads=max(1, self.opts.slots // 4))
                monitor.snapshot.heldout.append(
                    HeldOut(str(version), len(rewards), sum(rewards) / len(rewards), time.time()))
            stop.wait(2.0)

    def _await_warm_start(self, monitor: Monitor) -> float:
        """Traffic waits until the engine serves the warm start's version: the base model's
        rollouts would teach next to nothing meanwhile and slow the warm start down. Returns
        its minutes."""
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        from learner import warm_start

        s, started = self.settings, time.time()
        # Chains of calls by their messages: the learner also checks their tokens and trains a
        # call apart where its template renders the prompt otherwise (then the bar ends early).
        demonstrations = warm_start.read_demonstrations(s.learner.warm_start)
        rows = (len(warm_start.chains(demonstrations))
                if warm_start.trains_chained(s.learner.mode) else len(demonstrations))
        total = -(-rows // s.learner.batch_size) * s.learner.warm_start_epochs
        self._say(f"warm start: the learner trains {len(demonstrations)} demonstrations of "
                  f"{self.opts.warm_start_problems} worked problems ({total} steps); traffic "
                  "starts once the engine serves them")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console) as bar:
            job = bar.add_task("warm start steps", total=total)
            while (monitor.poll().policy_version or 0) < 1:
                self._check_alive()
                bar.update(job, completed=monitor.warm_start_step())
                time.sleep(3.0)
            bar.update(job, completed=total)
        minutes = (time.time() - started) / 60
        self._say(f"warm start served as policy version {monitor.snapshot.policy_version} "
                  f"after {minutes:.1f} minutes")
        return round(minutes, 2)

    def _serve_last_version(self, monitor: Monitor, timeout_s: float = 120.0) -> None:
        """Wait until the engine serves the newest registered version's policy version."""
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=self.settings.mlflow.uri)
        found = client.search_model_versions(f"name='{self.settings.mlflow.registered_model}'",
                                             order_by=["version_number DESC"], max_results=1)
        if not found:
            return
        want = int(found[0].tags.get("policy_version", found[0].version))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if monitor.poll().policy_version == want:
                return
            time.sleep(1.0)
        self._say(f"[yellow]the engine did not reach policy version {want} in {timeout_s:.0f}s; "
                  "evaluating what it serves[/]")

    # -- the whole run ------------------------------------------------------------------------
    def run(self) -> dict:
        opts, s = self.opts, self.settings
        t0 = time.time()
        try:
            self.bring_up()
            base, cached = self.base_accuracy()
            self._say(f"base model: held-out {self.task.metric} {base:.3f} (n={opts.n_eval}"
                      f"{', cached from an earlier run' if cached else ''})")
            self.start_pipeline()
            gateway_url = f"http://{s.gateway.host}:{s.gateway.port}/v1"
            traffic = Traffic(s, self.task, gateway_url, opts.workers, opts.group_size,
                              opts.temperature, self.folder)
            monitor = Monitor(s, self.engine_url, f"http://{s.streams.web_host}:{s.streams.web_port}",
                              traffic.stats, s.mlflow.experiment)
            stop = threading.Event()
            background = [threading.Thread(target=monitor.run, args=(stop,), daemon=True)]
            if opts.version_eval_n:
                background.append(threading.Thread(target=self._version_evals,
                                                   args=(monitor, stop), daemon=True))
            warm_minutes = self._await_warm_start(monitor) if opts.warm_start_problems else None
            train_started = time.time()
            traffic.start()
            for thread in background:
                thread.start()
            ends_at, stopped_early = traffic_ends_at(t0, train_started, opts), False
            if ends_at < train_started + opts.minutes * 60:
                self._say(f"[yellow]traffic cut to {(ends_at - train_started) / 60:.1f} of its "
                          f"{opts.minutes:g} minutes, to end within {opts.within:g} in all[/]")
            title = f"tracetrain demo: {self.task.name}, {opts.mode}, {opts.workers} agents"
            try:
                # a table on a terminal, a status line every 30 s in a piped log
                with live_view(self.console, monitor, title, ends_at, base,
                               metric=self.task.metric) as view:
                    while time.time() < ends_at:
                        time.sleep(1.0)
                        self._check_alive()
                        view.update()
            except KeyboardInterrupt:
                stopped_early = True
                self._say("stopped early by Ctrl-C; evaluating what was learned so far")
            stop.set()
            traffic.close()
            traffic_ended = time.time()
            services.stop(s, "learner", timeout_s=60)  # registers its last steps
            self._serve_last_version(monitor)
            final_version = monitor.snapshot.policy_version
            eval_started = time.time()
            rewards = evaluate.with_progress(self.task, self.heldout_problems, f"{self.engine_url}/v1",
                                             f"held-out, policy version {final_version}",
                                             threads=opts.slots, console=self.console)
            eval_seconds = time.time() - eval_started
            final = sum(rewards) / len(rewards)
            monitor.poll()
            summary = {
                "task": self.task.name, "metric": self.task.metric, "front_end": self.task.front_end, "mode": opts.mode, "base_accuracy": round(base, 4),
                "final_accuracy": round(final, 4), "n": opts.n_eval,
                "minutes": round((time.time() - t0) / 60, 2),
                "training_minutes": round((time.time() - train_started) / 60, 2),
                "traffic_minutes": round((traffic_ended - train_started) / 60, 2),
                "within_minutes": opts.within,
                "train_started": round(train_started, 3), "stopped_early": stopped_early,
                "versions": monitor.snapshot.versions, "final_policy_version": final_version,
                "mean_reload_s": None if monitor.mean_reload_s() is None else round(monitor.mean_reload_s(), 3),
                "rollouts": len(traffic.stats.episodes), "transitions": monitor.snapshot.transitions,
                "rollouts_per_min": round(len(traffic.stats.episodes) / max(
                    1e-9, (traffic_ended - train_started) / 60), 2),
                "eval_seconds": round(eval_seconds, 1),
                "warm_start_problems": opts.warm_start_problems, "warm_start_minutes": warm_minutes,
                "rehearsal_per_step": opts.rehearsal_per_step,
                "calc_style": self.task.style if self.task.name == "calc" else None,
                "heldout_per_version": [report.heldout_point(h, train_started)
                                        for h in monitor.snapshot.heldout],
                "agent_errors": traffic.stats.errors, "mlflow_ui": s.mlflow.uri,
                "experiment": s.mlflow.experiment, "registered_model": s.mlflow.registered_model,
            }
            report.write_summary(self.folder, summary)
            report.write_summary(s.home_dir / "demo", summary)  # the newest run, at a fixed path
            png = report.plot_curve(self.folder / "reward_curve.png", traffic.stats.episodes,
                                    monitor.snapshot.heldout, train_started,
                                    (base, opts.n_eval), (final, opts.n_eval))
            (s.home_dir / "demo" / "reward_curve.png").write_bytes(png.read_bytes())
            self._say(f"held-out {self.task.metric}: base {base:.3f} -> version {final_version} {final:.3f} "
                      f"(n={opts.n_eval} each); {summary['versions']} versions registered")
            self._say(f"summary {self.folder / 'summary.json'}, curve {png}")
            self._say(f"MLflow UI: {s.mlflow.uri}  (experiment {s.mlflow.experiment}, "
                      f"model {s.mlflow.registered_model})")
            return summary
        except httpx.HTTPError as exc:
            raise TracetrainError(f"a demo process stopped answering: {exc}; logs are in "
                                  f"{processes.log_dir(s.home_dir)}") from exc
        finally:
            self._say("stopping what the demo started ...")
            self.stop_all()
