"""Checkpoints in MLflow: log, register, alias `latest`, announce; find the newest to resume.

    store = CheckpointStore(settings, experiment="tracetrain", model_name="tracetrain-policy")
    info = store.save(policy, extra_state, step=8, offsets={...}, metrics={...})
    found = store.latest(into)  # (version, local dir) of the newest checkpoint of the experiment
    local = store.download(version, into)   # any registered version's checkpoint

Writes, per checkpoint: the adapter plus `trainer_state.pt` (optimizer, scheduler, RNG, offsets,
ledger) as artifacts `checkpoints/step-NNNNNNNN/` of the learner's MLflow run; a new version of
the registered model (`create_model_version` on that artifact URI, since `register_model`
needs an MLmodel file) tagged with experiment, base model, mode, step, policy_version, offsets
(JSON and one tag per partition) and the step's metrics, which moves the reserved alias
`latest` (MLflow resolves it to the newest version); and a Checkpoint
event on `settings.topics.checkpoints`. With a broker (`fence`, learner/fencing.py) the version
is registered inside a Kafka transaction that commits the consumed offsets and the announcement
together, and only by the experiment's newest learner; without one (bench/learner.py) it is
only registered, and the caller commits offsets after `save` returns.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from learner.fencing import Fence
from schemas import Codec
from tracetrain.records import Checkpoint
from tracetrain.settings import Settings

log = logging.getLogger("tracetrain.learner")


@dataclass
class SavedCheckpoint:
    version: int
    source: str
    run_id: str
    register_s: float


class CheckpointStore:
    def __init__(self, settings: Settings, experiment: str, model_name: str,
                 announce: bool = True):
        import mlflow
        from mlflow import MlflowClient

        self.settings = settings
        self.experiment = experiment
        self.model_name = model_name
        mlflow.set_tracking_uri(settings.mlflow.uri)
        self.client = MlflowClient(settings.mlflow.uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (found.experiment_id if found else
                              self.client.create_experiment(experiment))
        self.run_id: str | None = None
        self.run_started_ms: int | None = None
        self.codec = Codec(registry_url=settings.schema_registry.url)
        self.announce = announce  # False only where no broker exists (bench/learner.py)
        self.fence: Fence | None = None

    def take_over(self) -> None:
        """Become the experiment's one learner (with a broker): every learner started on it
        before can no longer register. Call before reading the newest checkpoint."""
        if self.announce:
            self.fence = Fence(self.settings, self.experiment, self.model_name,
                               newer_learner=self.newer_learner)

    def start_run(self, run_name: str, tags: dict[str, str]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.run_id, self.run_started_ms = run.info.run_id, run.info.start_time
        return self.run_id

    def newer_learner(self) -> bool:
        """Whether a learner started on this experiment after this one (its MLflow run is
        newer and still running). Unknown (MLflow unreachable) counts as yes: the caller
        then stops rather than fence a learner that may be the newest."""
        from mlflow.exceptions import MlflowException

        try:
            if self.run_id is None:
                return True
            newer = self.client.search_runs(
                [self.experiment_id], max_results=1,
                filter_string=f"attributes.status = 'RUNNING' and "
                              f"attributes.start_time > {self.run_started_ms}")
            return bool(newer)
        except (MlflowException, OSError) as exc:
            log.warning("cannot tell whether a newer learner runs (%s); assuming one does", exc)
            return True

    def end_run(self, status: str = "FINISHED") -> None:
        if self.run_id:
            self.client.set_terminated(self.run_id, status=status)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def _ensure_model(self) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(self.model_name)
        except MlflowException:
            self.client.create_registered_model(
                self.model_name, description="tracetrain policy checkpoints (LoRA adapters)")

    def save(self, policy, extra_state: dict, *, step: int, policy_version: int,
             offsets: dict[str, int], metrics: dict[str, float], group=None) -> SavedCheckpoint:
        """Log, register and (with a fence) announce one checkpoint, committing `offsets` for
        the consumer group whose metadata `group()` gives; raises LearnerFenced when a newer
        learner took the experiment over."""
        started = time.perf_counter()
        path = f"checkpoints/step-{step:08d}"
        with tempfile.TemporaryDirectory(prefix="tt-ckpt-") as tmp:
            policy.save(Path(tmp), extra_state)
            self.client.log_artifacts(self.run_id, tmp, artifact_path=path)
        run = self.client.get_run(self.run_id)
        source = f"{run.info.artifact_uri}/{path}"
        tags = {
            "experiment": self.experiment,
            "base_model": self.settings.base_model,
            "mode": self.settings.learner.mode,
            "step": str(step),
            "policy_version": str(policy_version),
            "offsets": json.dumps(offsets, sort_keys=True),
            "adapter_path": "adapter" if policy.is_peft else "model",
            **{f"offset.{k}": str(v) for k, v in offsets.items()},
            **{f"metric.{k}": f"{v:.6g}" for k, v in metrics.items()},
        }
        self._ensure_model()

        def register():
            # No set_registered_model_alias(..., "latest"): MLflow 3 reserves that alias and
            # resolves it to the newest version itself (get_model_version_by_alias(name,
            # "latest"), and models:/name@latest), so registering the version is what moves it.
            return self.client.create_model_version(self.model_name, source=source,
                                                    run_id=self.run_id, tags=tags)

        def announce(mv) -> tuple[str, bytes, bytes]:
            event = self._event(int(mv.version), policy_version, step, source, offsets, metrics)
            return self.settings.topics.checkpoints, self.model_name.encode(), event

        def unregister(mv) -> None:
            self.client.delete_model_version(self.model_name, mv.version)

        mv = register() if self.fence is None else \
            self.fence.commit(offsets, group, register, announce, unregister)
        register_s = time.perf_counter() - started
        return SavedCheckpoint(int(mv.version), source, self.run_id, register_s)

    def _event(self, version, policy_version, step, source, offsets, metrics) -> bytes:
        event: Checkpoint = {
            "model_name": self.model_name, "version": version, "policy_version": policy_version,
            "run_id": self.run_id, "step": step, "mode": self.settings.learner.mode,
            "source": source, "base_model": self.settings.base_model,
            "offsets": offsets, "metrics": {k: float(v) for k, v in metrics.items()},
            "created_ns": time.time_ns(),
        }
        return self.codec.encode("Checkpoint", event)

    def versions(self) -> list:
        """This experiment's registered versions, oldest first."""
        from mlflow.exceptions import MlflowException

        try:
            found = self.client.search_model_versions(f"name='{self.model_name}'")
        except MlflowException:
            return []
        mine = [v for v in found if v.tags.get("experiment") == self.experiment]
        return sorted(mine, key=lambda v: int(v.version))

    def latest(self, into: Path) -> tuple[object, Path] | None:
        """The newest registered checkpoint of the experiment, downloaded under `into`."""
        versions = self.versions()
        if not versions:
            return None
        return versions[-1], self.download(versions[-1], into)

    @staticmethod
    def download(version, into: Path) -> Path:
        """The local directory of a registered version's checkpoint (adapter or model, and
        `trainer_state.pt`: what `PolicyTrainer.load` resumes from), downloaded under `into`."""
        from mlflow.artifacts import download_artifacts

        return Path(download_artifacts(artifact_uri=version.source, dst_path=str(into)))
