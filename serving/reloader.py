"""The reloader: makes every engine of the pool serve the version a registered-model alias
points at.

    tracetrain reloader [--max-seconds S] [--max-loads N]

Reads MLflow (settings.mlflow.registered_model @ settings.reloader.alias; `latest`, which
MLflow reserves, means the highest version number) every
`reloader.poll_s` seconds, and, with `reloader.follow_checkpoints_topic`, wakes up early on
each `tracetrain.checkpoints` record. Downloads the version's artifacts into a temporary
folder beside `reloader.download_dir/<registered model>/N` (default
`home/reloader/versions/<registered model>/N`: every registered model numbers its versions from
1, so a folder per number alone would serve one model's weights as another's) and renames it
there once complete, so a transfer cut short is never loaded: it is fetched again. Loads the
version into each engine of `reloader.engine_urls` (or the one engine) that does not serve it
yet, one engine at a time (LoRA adapter or full weights; the embedded engine takes only folders
under the download folder, with its load key, serving/access.py), checks each reports the new
version, and writes `home/reloader/state.json` atomically (version served, which engine serves
which version and whether the pool has converged on it, reload latencies, broken versions, the
registered model it speaks of; the same JSON on `/state`, beside `/metrics` and `/healthz`,
when `tracetrain reloader` serves them on `reloader.metrics_port`); a restarted reloader starts
from it, unless it speaks of another registered model. Every poll asks each engine what it
serves, so an engine that restarted (back on the base model) or was down during a load gets the
version when it answers again. Never moves to a lower version than one it has loaded; a version
that fails to load `max_attempts` times is marked broken and not tried again; MLflow or engine
outages, a failed download included, are retried on the next poll without blaming the version.

One reloader drives the whole pool, rather than one per engine: a version is downloaded once,
one state file says which engine serves what, and loading one engine at a time keeps the rest
of the pool serving at full speed while each engine converts and starts its new version (on a
shared host the conversions would otherwise compete), and stops a version an engine refuses
before it reaches the others.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from urllib.parse import quote

from serving.access import download_dir, load_key
from serving.engine_client import EngineClient, EngineUnavailable
from serving.errors import LoadError, ServingError
from serving.service import engine_urls
from tracetrain.observability import Metrics, StatusServer
from tracetrain.settings import Settings

log = logging.getLogger("tracetrain.reloader")
LOADS_KEPT = 200  # state.json outlives the process: keep its history of loads bounded


@dataclass
class Target:
    version: int
    source: str
    policy_version: int
    registered_ms: int | None = None


def _as_target(mv) -> Target:
    tag = (mv.tags or {}).get("policy_version")
    return Target(int(mv.version), mv.source, int(tag) if tag else int(mv.version),
                  mv.last_updated_timestamp)


@dataclass
class ReloaderState:
    registered_model: str | None = None  # None: a state.json of before it was recorded
    # The newest version loaded (into one engine or more): the pool's, which it never leaves
    # for a lower one.
    serving_version: int | None = None
    policy_version: int | None = None
    loads: list[dict] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    # engine URL -> {"serving_version", "policy_version", "path", "error"}: what it was last
    # seen to serve, and why the last contact with it failed (None: it answered).
    engines: dict[str, dict] = field(default_factory=dict)
    converged: bool = False  # every engine answers and serves `serving_version`


class ReloaderMetrics:
    def __init__(self) -> None:
        m = self.metrics = Metrics("reloader")
        self.polls = m.counter("registry", "polls", "Registry polls.")
        self.loads = m.counter("engine", "loads", "Loads into the engine by outcome (ok, failed).",
                               ["outcome"])
        self.load_seconds = m.histogram("load_duration", "seconds", "Download, load and check "
                                        "of a version that loaded.",
                                        buckets=(0.5, 1, 2, 5, 10, 30, 60, 120))
        self.serving_version = m.gauge("serving", "version", "Registered version the engine "
                                       "serves (0: none yet).")
        self.policy_version = m.gauge("policy", "version", "policy_version the engine serves.")
        self.broken = m.gauge("broken", "versions", "Versions marked broken (never retried).")
        self.engine_version = m.gauge("engine_serving", "version", "Registered version each "
                                      "engine of the pool serves (0: none yet, or unknown).",
                                      ["engine"])
        self.converged = m.gauge("converged", "value", "1 when every engine of the pool "
                                 "answers and serves the newest version loaded, else 0.")
        self.downloads = m.counter("downloaded", "versions", "Version downloads by outcome (ok, "
                                   "failed: fetched again on the next poll).", ["outcome"])


def _remove_dead_partials(downloads: Path) -> None:
    """Temporary download folders whose reloader died mid-transfer (kill -9, power loss)."""
    for stale in downloads.glob("*/.*.partial-*"):
        pid = stale.name.split(".partial-")[1].split("-")[0]
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            shutil.rmtree(stale, ignore_errors=True)


def find_checkpoint(folder: Path) -> tuple[str, Path]:
    """('lora', dir) or ('full', dir): the shallowest folder holding a PEFT or HF checkpoint."""
    for marker, kind in (("adapter_config.json", "lora"), ("config.json", "full")):
        hits = sorted(folder.rglob(marker), key=lambda p: len(p.parts))
        if hits:
            return kind, hits[0].parent
    raise LoadError(f"{folder} holds neither adapter_config.json (LoRA) nor config.json (full)")


class Reloader:
    def __init__(self, settings: Settings, client: EngineClient | None = None,
                 folder: Path | None = None):
        self.settings = settings
        self.cfg = settings.reloader
        # MLflow retries a dead server for minutes by default; we retry on our own schedule.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow import MlflowClient

        self.mlflow = MlflowClient(tracking_uri=settings.mlflow.uri)
        key = load_key(settings) if settings.engine.backend == "embedded" else None
        self.engines = {client.base_url: client} if client else {
            url: EngineClient(url, settings.engine.backend, settings.engine.served_name,
                              load_key=key) for url in engine_urls(settings)}
        self.folder = folder or settings.home_dir / "reloader"  # state.json
        self.folder.mkdir(parents=True, exist_ok=True)
        self.downloads = download_dir(settings) / quote(settings.mlflow.registered_model, safe="")
        self.downloads.mkdir(parents=True, exist_ok=True)
        _remove_dead_partials(self.downloads.parent)
        self.metrics = ReloaderMetrics()
        self.state = self._restore()
        self._next_try: dict[int, float] = {}
        self._said: set[str] = set()

    # ---- one step ---------------------------------------------------------------------------
    def target(self) -> Target | None:
        from mlflow.exceptions import MlflowException

        name, alias = self.settings.mlflow.registered_model, self.cfg.alias
        try:
            if alias == "latest":
                # MLflow reserves the alias "latest": it means the highest version number.
                found = self.mlflow.search_model_versions(
                    f"name='{name}'", order_by=["version_number DESC"], max_results=1)
                if not found:
                    self._once(f"no version of {name} in MLflow yet; waiting")
                    return None
                mv = found[0]
            else:
                mv = self.mlflow.get_model_version_by_alias(name, alias)
        except MlflowException as exc:
            if "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code) or "not found" in str(exc).lower():
                self._once(f"no {name}@{alias} in MLflow yet; waiting")
                return None
            raise ServingError(f"MLflow at {self.settings.mlflow.uri} failed: {exc}") from exc
        return _as_target(mv)

    def version(self, number: int) -> Target:
        """Registered version `number` of the model (`tracetrain eval --version`)."""
        from mlflow.exceptions import MlflowException

        name = self.settings.mlflow.registered_model
        try:
            return _as_target(self.mlflow.get_model_version(name, str(number)))
        except MlflowException as exc:
            raise ServingError(f"version {number} of {name} not found in MLflow at "
                               f"{self.settings.mlflow.uri}: {exc}") from exc

    def step(self) -> bool:
        """Bring every engine that answers to the alias's version, one at a time, where it
        does not serve it yet; True if they all loaded it now."""
        self.metrics.polls.inc()
        try:
            target = self.target()
        except ServingError as exc:
            self._error(f"{exc}; retrying in {self.cfg.poll_s}s")
            return False
        if target is None:
            return False
        key = str(target.version)
        if key in self.state.broken:
            self._once(f"version {key} is broken ({self.state.broken[key]}); staying on "
                       f"version {self.state.serving_version}, not retrying it")
            return False
        current = self.state.serving_version
        if current is not None and target.version < current:
            self._once(f"alias moved back to version {target.version}; staying on {current} "
                       "(the reloader never moves backwards)")
            return False
        if time.monotonic() < self._next_try.get(target.version, 0.0):
            return False
        behind = self._behind(target)
        if not behind:
            self._converged()
            return False
        return self.load(target, behind)

    def _behind(self, target: Target) -> list[str]:
        """The engines that answer and do not serve `target`; one that does not answer is
        noted and left for the next poll."""
        behind = []
        for url, engine in self.engines.items():
            seen = self.state.engines.get(url) or {}
            try:
                if seen.get("serving_version") == target.version and \
                        engine.serves(seen.get("path") or "", target.policy_version):
                    seen["error"] = None
                    continue
            except EngineUnavailable as exc:
                self._engine_error(url, f"{exc}; retrying in {self.cfg.poll_s}s")
                continue
            behind.append(url)
        return behind

    def _local(self, target: Target) -> str:
        return str(self.downloads / str(target.version))

    def load(self, target: Target, urls: list[str] | None = None) -> bool:
        """Download `target` (once) and load it into each engine of `urls` (default: the
        whole pool), one after another; True if every one of them serves it now."""
        started = time.monotonic()
        try:
            dst = self._download(target)
        except ServingError as exc:
            self.metrics.downloads.labels("failed").inc()
            self._error(f"{exc}; not counted against the version, fetched again on the next "
                        "poll")
            return False
        try:
            kind, folder = find_checkpoint(dst)
        except (LoadError, OSError) as exc:
            return self._failed(target, exc)
        urls = list(self.engines) if urls is None else urls
        for url in urls:
            engine = self.engines[url]
            try:
                load = engine.load_lora if kind == "lora" else engine.load_full
                load(str(folder), target.policy_version)
                self._verify(engine, str(folder), target)
            except EngineUnavailable as exc:
                self._engine_error(url, f"{exc}; retrying in {self.cfg.poll_s}s")
                continue
            except (LoadError, OSError) as exc:
                # The version, not the engine, is to blame: it goes no further this time.
                self._seen(url)["error"] = f"refused version {target.version}: {exc}"
                self._converged()
                return self._failed(target, exc)
            self._loaded(url, target, kind, str(folder), time.monotonic() - started)
        self._converged()
        self._save()
        return all((self.state.engines.get(url) or {}).get("serving_version") == target.version
                   for url in urls)

    def _loaded(self, url: str, target: Target, kind: str, path: str, seconds: float) -> None:
        since_registry = (time.time() * 1000 - target.registered_ms) / 1000 \
            if target.registered_ms else None
        self.state.serving_version, self.state.policy_version = target.version, \
            target.policy_version
        self.state.engines[url] = {"serving_version": target.version,
                                   "policy_version": target.policy_version, "path": path,
                                   "error": None}
        self.state.attempts.pop(str(target.version), None)
        self.state.last_error = None
        self.state.loads.append({"version": target.version, "policy_version":
                                 target.policy_version, "kind": kind, "engine": url,
                                 "seconds": seconds, "since_alias_s": since_registry,
                                 "at": time.time()})
        del self.state.loads[:-LOADS_KEPT]
        self.metrics.loads.labels("ok").inc()
        self.metrics.load_seconds.observe(seconds)
        self.metrics.serving_version.set(target.version)
        self.metrics.policy_version.set(target.policy_version)
        self.metrics.engine_version.labels(url).set(target.version)
        log.info("engine %s now serves version %s (policy_version %d, %s), %.2fs after the "
                 "version's download began", url, target.version, target.policy_version, kind,
                 seconds)

    def _seen(self, url: str) -> dict:
        return self.state.engines.setdefault(url, {"serving_version": None,
                                                   "policy_version": None, "path": None,
                                                   "error": None})

    def _engine_error(self, url: str, message: str) -> None:
        self._seen(url)["error"] = message
        self._error(message)

    def _converged(self) -> None:
        serving = self.state.serving_version
        self.state.converged = serving is not None and all(
            (seen := self.state.engines.get(url)) is not None and seen.get("error") is None
            and seen.get("serving_version") == serving for url in self.engines)
        self.metrics.converged.set(int(self.state.converged))

    def _download(self, target: Target) -> Path:
        """The version's folder, downloaded whole: into a temporary folder first, renamed into
        place only once the transfer completed (a cut one leaves nothing that looks done)."""
        import mlflow.artifacts

        dst = Path(self._local(target))
        if dst.is_dir() and any(dst.iterdir()):
            return dst
        partial = Path(tempfile.mkdtemp(prefix=f".{target.version}.partial-{os.getpid()}-",
                                        dir=self.downloads))
        try:
            mlflow.artifacts.download_artifacts(artifact_uri=target.source, dst_path=str(partial),
                                                tracking_uri=self.settings.mlflow.uri)
            try:
                partial.rename(dst)  # over an empty folder too; atomic on one file system
            except OSError:
                if not (dst.is_dir() and any(dst.iterdir())):
                    raise
                # another reloader (an evaluation's) finished the same version first
        except Exception as exc:  # mlflow raises many types for a transfer cut short
            raise ServingError(f"download of version {target.version} from {target.source} "
                               f"failed: {type(exc).__name__}: {exc}") from exc
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        self.metrics.downloads.labels("ok").inc()
        return dst

    def _verify(self, engine: EngineClient, path: str, target: Target) -> None:
        deadline = time.monotonic() + self.cfg.verify_timeout_s
        while not engine.serves(path, target.policy_version):
            if time.monotonic() > deadline:
                raise LoadError(f"engine {engine.base_url} accepted version {target.version} "
                                f"but does not report it after {self.cfg.verify_timeout_s}s")
            time.sleep(0.1)

    def _failed(self, target: Target, exc: Exception) -> bool:
        key = str(target.version)
        attempts = self.state.attempts.get(key, 0) + 1
        self.state.attempts[key] = attempts
        reason = f"{type(exc).__name__}: {exc}"
        self.metrics.loads.labels("failed").inc()
        if attempts >= self.cfg.max_attempts:
            self.state.broken[key] = reason
            self.metrics.broken.set(len(self.state.broken))
            self._error(f"version {key} failed {attempts} times, marked broken; staying on "
                        f"version {self.state.serving_version}: {reason}")
        else:
            wait = self.cfg.retry_s * 2 ** (attempts - 1)
            self._next_try[target.version] = time.monotonic() + wait
            self._error(f"loading version {key} failed (attempt {attempts}/"
                        f"{self.cfg.max_attempts}, next in {wait:.1f}s): {reason}")
        self._save()
        return False

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, max_seconds: float | None = None, max_loads: int | None = None,
            stop: threading.Event | None = None) -> ReloaderState:
        stop = stop or threading.Event()
        deadline = time.monotonic() + max_seconds if max_seconds else None
        wake = self._checkpoint_waker()
        loads = 0
        log.info("following %s@%s in %s for %s", self.settings.mlflow.registered_model,
                 self.cfg.alias, self.settings.mlflow.uri, ", ".join(self.engines))
        try:
            while not stop.is_set():
                loads += self.step()
                if max_loads is not None and loads >= max_loads:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                wait = self.cfg.poll_s
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                if wake is not None:
                    wake(wait)
                else:
                    stop.wait(wait)
        finally:
            for engine in self.engines.values():
                engine.close()
        return self.state

    def _checkpoint_waker(self):
        """With follow_checkpoints_topic: a wait that ends early when a checkpoint is announced."""
        if not self.cfg.follow_checkpoints_topic:
            return None
        from confluent_kafka import Consumer

        consumer = Consumer({"bootstrap.servers": self.settings.kafka.bootstrap_servers,
                             "group.id": f"tracetrain-reloader-{os.getpid()}",
                             "auto.offset.reset": "latest", "enable.auto.commit": False})
        consumer.subscribe([self.settings.topics.checkpoints])

        def wait(seconds: float) -> None:
            message = consumer.poll(max(seconds, 0.01))
            if message is not None and message.error() is None:
                log.info("checkpoint announced on %s; polling MLflow now", message.topic())

        return wait

    def serve_status(self) -> StatusServer:
        """/metrics, /healthz and /state (the state.json content) on reloader.metrics_port."""
        return StatusServer(self.metrics.metrics, lambda: asdict(self.state),
                            self.cfg.metrics_host, self.cfg.metrics_port)

    def _save(self) -> None:
        """state.json replaced whole: a crash leaves the old state or the new, never half."""
        path = self.folder / "state.json"
        fresh = path.with_name(f".state.json.{os.getpid()}")
        fresh.write_text(json.dumps(asdict(self.state), indent=1))
        os.replace(fresh, path)

    def _restore(self) -> ReloaderState:
        """The state a previous run saved: what it served, what is broken, attempts so far."""
        path = self.folder / "state.json"
        try:
            saved = json.loads(path.read_text())
            state = ReloaderState(**{f.name: saved[f.name] for f in fields(ReloaderState)
                                     if f.name in saved})
        except FileNotFoundError:
            return ReloaderState(registered_model=self.settings.mlflow.registered_model)
        except (ValueError, TypeError) as exc:
            kept = path.with_name("state.json.unreadable")
            os.replace(path, kept)
            log.error("%s could not be read (%s); starting afresh, the file is kept as %s",
                      path, exc, kept)
            return ReloaderState(registered_model=self.settings.mlflow.registered_model)
        model = self.settings.mlflow.registered_model
        # None: a state.json of before the model was recorded, whose versions may be another
        # model's; starting afresh costs one reload
        if state.registered_model != model:
            # its serving version would make this reloader skip lower numbers as going back
            log.info("%s speaks of registered model %r, not %r: starting afresh", path,
                     state.registered_model, model)
            return ReloaderState(registered_model=model)
        state.registered_model = model
        if state.serving_version is not None:
            self.metrics.serving_version.set(state.serving_version)
            self.metrics.policy_version.set(state.policy_version or 0)
        for url, seen in state.engines.items():
            if url in self.engines:
                self.metrics.engine_version.labels(url).set(seen.get("serving_version") or 0)
        self.metrics.broken.set(len(state.broken))
        log.info("restored %s: version %s served, broken %s", path, state.serving_version,
                 sorted(state.broken) or "none")
        return state

    def _once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            log.warning(message)

    def _error(self, message: str) -> None:
        self.state.last_error = message
        log.error(message)
