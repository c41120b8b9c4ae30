"""tracetrain.observability: the naming scheme, own registries, the status server, logging."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import pytest
from prometheus_client import REGISTRY

from tracetrain.observability import (
    Metrics,
    ObservabilityError,
    StatusServer,
    configure_logging,
    metric_name,
    scheme_pattern,
    values,
)


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_names_follow_the_scheme_and_bad_parts_are_named():
    assert metric_name("learner", "trained", "steps") == "tracetrain_learner_trained_steps"
    with pytest.raises(ObservabilityError, match="'trainer'.*expected one of gateway"):
        metric_name("trainer", "trained", "steps")
    with pytest.raises(ObservabilityError, match="unit 'step'"):
        metric_name("learner", "trained", "step")
    with pytest.raises(ObservabilityError, match="'Trained'"):
        metric_name("learner", "Trained", "steps")
    pattern = scheme_pattern("learner")
    assert pattern.match("tracetrain_learner_trained_steps_total")
    assert pattern.match("tracetrain_learner_step_duration_seconds_bucket")
    assert not pattern.match("tracetrain_learner_steps")
    assert not pattern.match("tracetrain_engine_trained_steps_total")


def test_each_metrics_has_its_own_registry_and_none_reaches_the_global_one():
    before = set(REGISTRY._names_to_collectors)
    one, two = Metrics("engine"), Metrics("engine")
    a = one.counter("generated", "tokens", "Tokens.", ["route"])
    b = two.counter("generated", "tokens", "Tokens.", ["route"])  # same name, no collision
    a.labels(route="chat").inc(3)
    a.labels(route="completion").inc(2)
    b.labels(route="chat").inc()
    assert values(a, "route") == {"chat": 3.0, "completion": 2.0}
    assert values(a) == 5.0 and values(b) == 1.0
    assert set(REGISTRY._names_to_collectors) == before
    text = one.exposition().decode()
    assert 'tracetrain_engine_generated_tokens_total{route="chat"} 3.0' in text


def test_status_server_serves_metrics_health_and_state():
    metrics = Metrics("reloader")
    loads = metrics.counter("engine", "loads", "Loads.", ["outcome"])
    loads.labels(outcome="ok").inc()
    state = {"serving_version": 3, "loss": float("nan")}
    with StatusServer(metrics, state=lambda: state) as server:
        assert server.port > 0  # port 0 picked a free one
        code, kind, text = _get(f"{server.url}/metrics")
        assert code == 200 and kind.startswith("text/plain")
        names = [line.split("{")[0].split(" ")[0] for line in text.splitlines()
                 if line and not line.startswith("#")]
        assert names and all(scheme_pattern("reloader").match(n) for n in names), names
        code, _, body = _get(f"{server.url}/healthz")
        assert code == 200 and json.loads(body) == {"ok": True, "stage": "reloader"}
        code, kind, body = _get(f"{server.url}/state")
        assert code == 200 and kind == "application/json"
        assert json.loads(body) == {"loss": None, "serving_version": 3}  # NaN is not JSON
        code, _, body = _get(f"{server.url}/nothing")
        assert code == 404 and "/state" in json.loads(body)["error"]


def test_a_failing_state_reader_answers_500_with_its_error():
    def broken() -> dict:
        raise KeyError("policy_version")

    with StatusServer(Metrics("learner"), state=broken) as server:
        code, _, body = _get(f"{server.url}/state")
    assert code == 500 and "KeyError" in json.loads(body)["error"]


def test_a_taken_port_names_the_port():
    with StatusServer(Metrics("learner"), state=dict) as first:
        with pytest.raises(ObservabilityError, match=f":{first.port} .*free port"):
            StatusServer(Metrics("learner"), state=dict, port=first.port)


def test_configure_logging_once_replaces_instead_of_adding():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    httpx_level = logging.getLogger("httpx").level
    try:
        configure_logging("debug")
        configure_logging("WARNING")
        ours = [h for h in root.handlers if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)]
        assert root.level == logging.WARNING and len(ours) == 1
        configure_logging("INFO")
        assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING
        with pytest.raises(ObservabilityError, match="'LOUD'.*DEBUG, INFO"):
            configure_logging("LOUD")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.getLogger("httpx").setLevel(httpx_level)
