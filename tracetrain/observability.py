"""Metrics and logs, the same in every long-running process (gateway, streams worker, learner,
engine, reloader).

    metrics = Metrics("learner")                       # the process's own Prometheus registry
    steps = metrics.counter("trained", "steps", "Training steps taken.")
    configure_logging("INFO")                          # once, where the process starts
    with StatusServer(metrics, state=lambda: {...}, port=8200) as server:
        ...                                            # /metrics, /healthz, /state on server.url

Names follow one scheme, `tracetrain_<stage>_<what>_<unit>` (Prometheus adds `_total` to
counters), with the stage and unit from the fixed lists below, so a dashboard finds every
process's figures the same way. Each `Metrics` holds its own `CollectorRegistry`: nothing goes
into prometheus_client's global default registry, so two apps in one process (tests) never
share or collide on counters.

`/metrics` is for people and Prometheus. Code that decides something (wait until a worker has
caught up, count transitions for a dashboard) reads `/state`, the process's typed state as
JSON, never the metric text.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from tracetrain.errors import TracetrainError

PREFIX = "tracetrain"
STAGES = ("gateway", "publisher", "streams", "learner", "engine", "reloader")
# What a figure counts or measures; `version` is a version number held by a gauge.
UNITS = ("records", "events", "rollouts", "transitions", "calls", "tokens", "batches",
         "steps", "checkpoints", "loads", "polls", "versions", "version", "seconds", "bytes",
         "ratio", "value")
_PART = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
QUIET_LOGGERS = ("httpx", "httpcore")
STATE_PATH, HEALTH_PATH, METRICS_PATH = "/state", "/healthz", "/metrics"

log = logging.getLogger("tracetrain.observability")


class ObservabilityError(TracetrainError, ValueError):
    """A metric name outside the scheme, or a log level that does not exist."""


def metric_name(stage: str, what: str, unit: str) -> str:
    """`tracetrain_<stage>_<what>_<unit>`, checked against the scheme."""
    if stage not in STAGES:
        raise ObservabilityError(f"metric stage {stage!r}: expected one of {', '.join(STAGES)}")
    if unit not in UNITS:
        raise ObservabilityError(f"metric unit {unit!r} (of {stage} {what!r}): expected one of "
                                 f"{', '.join(UNITS)}")
    if not _PART.match(what) or what.endswith("_total"):
        raise ObservabilityError(f"metric part {what!r} (of {stage}, unit {unit}): expected "
                                 "lower-case words joined by '_', not ending in _total")
    return f"{PREFIX}_{stage}_{what}_{unit}"


def scheme_pattern(stage: str) -> re.Pattern:
    """Matches every sample name a `Metrics(stage)` can export (`_total`, `_bucket`, ...
    included): what tests check a scrape against."""
    units = "|".join(UNITS)
    return re.compile(rf"^{PREFIX}_{stage}_[a-z0-9_]+_({units})"
                      r"(_total|_created|_bucket|_count|_sum)?$")


class Metrics:
    """One process's (or one component's) Prometheus registry, naming under the scheme."""

    def __init__(self, stage: str):
        metric_name(stage, "check", "value")  # fails early on an unknown stage
        self.stage = stage
        self.registry = CollectorRegistry()

    def counter(self, what: str, unit: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(metric_name(self.stage, what, unit), doc, list(labels),
                       registry=self.registry)

    def gauge(self, what: str, unit: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(metric_name(self.stage, what, unit), doc, list(labels),
                     registry=self.registry)

    def histogram(self, what: str, unit: str, doc: str, labels: Sequence[str] = (),
                  buckets: Sequence[float] | None = None) -> Histogram:
        extra = {"buckets": tuple(buckets)} if buckets is not None else {}
        return Histogram(metric_name(self.stage, what, unit), doc, list(labels),
                         registry=self.registry, **extra)

    def register(self, collector) -> None:
        """Also export `collector` (e.g. a component's own registry or custom collector)."""
        self.registry.register(collector)

    def exposition(self) -> bytes:
        """The Prometheus text of this registry."""
        return generate_latest(self.registry)


CONTENT_TYPE = CONTENT_TYPE_LATEST  # of /metrics
# aiohttp (the Faust web server) refuses a charset inside content_type; the text is ASCII.
AIOHTTP_CONTENT_TYPE = CONTENT_TYPE_LATEST.split(";")[0]


def values(metric: Counter | Gauge, label: str | None = None) -> Any:
    """The current value(s) of a counter or gauge, read in process (no text): a number for an
    unlabelled metric, else `{label value: number}` keyed by `label` (summed over the other
    labels)."""
    out: dict[str, float] = {}
    total = 0.0
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            total += sample.value
            if label is not None:
                key = sample.labels[label]
                out[key] = out.get(key, 0.0) + sample.value
    return out if label is not None else total


def configure_logging(level: str | int = "INFO") -> None:
    """The one logging set-up: root logger at `level`, one format, to stderr. Call once where a
    process starts; calling again replaces the handler instead of adding a second one."""
    if isinstance(level, str):
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            raise ObservabilityError(f"log level {level!r}: expected one of DEBUG, INFO, "
                                     "WARNING, ERROR, CRITICAL")
        level = number
    logging.basicConfig(level=level, format=LOG_FORMAT, force=True)
    logging.captureWarnings(True)
    # httpx logs every request at INFO: the reloader's and the demo's polls would drown the log
    for chatty in QUIET_LOGGERS:
        logging.getLogger(chatty).setLevel(max(level, logging.WARNING))


def json_safe(value: Any) -> Any:
    """JSON-safe: NaN and infinities (a loss before the first step) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def state_json(state: dict) -> bytes:
    """The body of a `/state` page."""
    return json.dumps(json_safe(state), sort_keys=True).encode()


class StatusServer:
    """`/metrics`, `/healthz` and `/state` for a process with no web server of its own (the
    learner, the reloader), on a daemon thread. Port 0 picks a free port (tests)."""

    def __init__(self, metrics: Metrics, state: Callable[[], dict], host: str = "127.0.0.1",
                 port: int = 0):
        self.metrics, self.state = metrics, state
        handler = type("Handler", (_Handler,), {"status": self})
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise ObservabilityError(f"{metrics.stage} status server: cannot listen on "
                                     f"{host}:{port} ({exc}); expected a free port "
                                     "(0 picks one)") from exc
        self._server.daemon_threads = True
        self.host, self.port = host, self._server.server_address[1]
        # a short poll interval: close() waits for one
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name=f"{metrics.stage}-status", daemon=True)
        self._thread.start()
        log.info("%s: metrics on %s%s, state on %s%s", metrics.stage, self.url, METRICS_PATH,
                 self.url, STATE_PATH)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> StatusServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    status: StatusServer

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == METRICS_PATH:
            self._send(200, self.status.metrics.exposition(), CONTENT_TYPE)
        elif path == HEALTH_PATH:
            self._send(200, state_json({"ok": True, "stage": self.status.metrics.stage}))
        elif path == STATE_PATH:
            try:
                body = state_json(self.status.state())
            except Exception as exc:  # a broken state reader answers 500, not a closed socket
                log.exception("%s: /state failed", self.status.metrics.stage)
                self._send(500, state_json({"error": f"{type(exc).__name__}: {exc}"}))
                return
            self._send(200, body)
        else:
            self._send(404, state_json({"error": f"no page {path!r}; expected one of "
                                        f"{METRICS_PATH}, {HEALTH_PATH}, {STATE_PATH}"}))

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the stdlib's name)
        log.debug("%s: " + format, self.status.metrics.stage, *args)
