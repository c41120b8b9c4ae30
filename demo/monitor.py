"""What the dashboard shows, gathered from the running processes every couple of seconds:
the engine's policy version (/v1/policy), the reloader's loads (its state.json), the streams
worker's transition count (its typed /state page, never the metric text), the learner's last
metrics (its MLflow run), plus the agents' own episodes and the held-out evaluations the demo
runs at each new version."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx

from demo.traffic import TrafficStats
from tracetrain.settings import Settings

LEARNER_KEYS = ("loss", "mean_reward", "staleness", "kl", "grad_norm", "sft_examples")


@dataclass
class HeldOut:
    version: str
    n: int
    accuracy: float
    at: float


@dataclass
class Snapshot:
    policy_version: int | None = None
    transitions: int = 0
    transitions_per_s: float = 0.0
    learner: dict[str, float] = field(default_factory=dict)
    learner_step: int | None = None
    versions: int = 0
    loads: list[dict] = field(default_factory=list)
    heldout: list[HeldOut] = field(default_factory=list)


class Monitor:
    def __init__(self, settings: Settings, engine_url: str, streams_url: str,
                 traffic: TrafficStats, experiment: str):
        self.settings, self.engine_url, self.streams_url = settings, engine_url, streams_url
        self.traffic, self.experiment = traffic, experiment
        self.snapshot = Snapshot()
        self.started = time.time()
        self._http = httpx.Client(timeout=5.0)
        self._last_count: tuple[float, int] | None = None
        self._mlflow = None

    # -- polling ------------------------------------------------------------------------------
    def poll(self) -> Snapshot:
        s = self.snapshot
        try:
            s.policy_version = self._http.get(f"{self.engine_url}/v1/policy").json()["policy_version"]
        except (httpx.HTTPError, ValueError, KeyError):
            pass  # the engine is busy or reloading; keep the last value
        self._poll_transitions(s)
        state = self.settings.home_dir / "reloader" / "state.json"
        if state.is_file():
            try:
                s.loads = json.loads(state.read_text()).get("loads", [])
            except ValueError:
                pass  # being rewritten right now
        self._poll_learner(s)
        return s

    def _poll_transitions(self, s: Snapshot) -> None:
        try:
            total = self._http.get(f"{self.streams_url}/state").json()["output_transitions"]
        except (httpx.HTTPError, ValueError, KeyError):
            return  # the worker is starting or rebalancing; keep the last count
        now = time.time()
        if self._last_count is not None and now > self._last_count[0]:
            rate = (total - self._last_count[1]) / (now - self._last_count[0])
            s.transitions_per_s = 0.7 * s.transitions_per_s + 0.3 * rate if s.transitions else rate
        self._last_count = (now, int(total))
        s.transitions = int(total)

    def _poll_learner(self, s: Snapshot) -> None:
        from mlflow.exceptions import MlflowException

        try:
            run = self._learner_run()
            if run is not None:
                s.learner = {k: v for k, v in run.data.metrics.items() if k in LEARNER_KEYS}
                history = self._mlflow.get_metric_history(run.info.run_id, "loss")
                s.learner_step = history[-1].step if history else None
            versions = self._mlflow.search_model_versions(
                f"name='{self.settings.mlflow.registered_model}'")
            s.versions = len(versions)
        except (MlflowException, OSError):
            pass  # the dashboard must not die with a slow server

    def _learner_run(self):
        """The experiment's newest MLflow run (the learner's), or None."""
        if self._mlflow is None:
            from mlflow import MlflowClient

            self._mlflow = MlflowClient(tracking_uri=self.settings.mlflow.uri)
        exp = self._mlflow.get_experiment_by_name(self.experiment)
        runs = [] if exp is None else self._mlflow.search_runs(
            [exp.experiment_id], order_by=["start_time DESC"], max_results=1)
        return runs[0] if runs else None

    def warm_start_step(self) -> int:
        """Steps of the learner's warm start taken so far (its `warm_start_loss` history)."""
        from mlflow.exceptions import MlflowException

        try:
            run = self._learner_run()
            if run is not None:
                return len(self._mlflow.get_metric_history(run.info.run_id, "warm_start_loss"))
        except (MlflowException, OSError):
            pass
        return 0

    # -- derived figures ----------------------------------------------------------------------
    def rollouts_per_s(self, window_s: float = 60.0) -> float:
        recent = self.traffic.window(window_s)
        span = min(window_s, time.time() - self.started)
        return len(recent) / span if span > 0 else 0.0

    def moving_reward(self, last: int = 64) -> float | None:
        with self.traffic.lock:
            recent = self.traffic.episodes[-last:]
        return sum(e.reward for e in recent) / len(recent) if recent else None

    def mean_reload_s(self) -> float | None:
        loads = self.snapshot.loads
        return sum(x["seconds"] for x in loads) / len(loads) if loads else None

    def run(self, stop: threading.Event, every_s: float = 2.0) -> None:
        while not stop.is_set():
            self.poll()
            stop.wait(every_s)
