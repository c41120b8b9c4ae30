"""Shared fixtures and the markers every test gets from the fixtures it uses.

The shared fixtures (the session broker, MLflow server, default model, per-test topics) live
in `testkit/fixtures/` and are loaded here, the one place, through `pytest_plugins`; helpers
and test doubles are plain imports from `testkit`. A stage's own fixtures live in
`tests/STAGE/conftest.py`.

Markers are derived, not applied by hand, so the fast tier cannot drift into starting a
service: a test that uses a fixture (directly or through another fixture) gets that
fixture's markers below. `faults`, `slow` and `gpu` say how a test behaves, not what it
uses, and stay hand-applied.
"""

from __future__ import annotations

pytest_plugins = [
    "testkit.fixtures.home",
    "testkit.fixtures.kafka",
    "testkit.fixtures.mlflow",
    "testkit.fixtures.model",
    "testkit.fixtures.stack",
    "testkit.fixtures.streams",
]

# A fixture that starts something maps to what it starts. Dependencies need no entry of
# their own: `item.fixturenames` is the closure, so `kafka_settings` (which uses
# `kafka_broker`) and `tiny_model_dir` (which uses `base_model_dir`) are covered.
FIXTURE_MARKERS: dict[str, tuple[str, ...]] = {
    # Java: the session broker, a broker of the test's own, brokers it starts itself
    "kafka_broker": ("integration",),
    "own_broker": ("integration",),
    "kafka_home": ("integration",),
    # the MLflow server process
    "mlflow_server": ("mlflow",),
    # a PostgreSQL server and an MLflow server on it
    "postgres_mlflow": ("mlflow",),
    # the default model (converted once, then loaded by whoever asks for it)
    "base_model_dir": ("model",),
    # fixtures that spawn a stage's process (engine, streams worker, a whole stack)
    "engine_proc": ("processes",),
    "engine_url": ("processes",),
    "reload_engine": ("processes",),
    "one_slot_engine": ("processes",),
    "engine_pool": ("processes",),
    "optimizer_engine": ("processes",),
    "workers": ("processes",),
    "torchrun": ("processes",),
    "stack_home": ("integration", "mlflow", "processes"),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, markers in FIXTURE_MARKERS.items():
            if fixture not in used:
                continue
            for marker in markers:
                if item.get_closest_marker(marker) is None:
                    item.add_marker(marker)
