"""Shared fixtures, loaded from testkit/fixtures/ in one place.

The shared fixtures (the session broker, MLflow server, default model, per-test topics) live
in `testkit/fixtures/` and are loaded here, the one place, through `pytest_plugins`; helpers
and test doubles are plain imports from `testkit`. A stage's own fixtures live in
`tests/STAGE/conftest.py`.
"""

from __future__ import annotations

pytest_plugins = [
    "testkit.fixtures.home",
    "testkit.fixtures.kafka",
    "testkit.fixtures.mlflow",
    "testkit.fixtures.model",
]
