"""The optimiser's fixture: one real embedded engine on the default model for the module."""

from __future__ import annotations

import pytest

from infra import services
from serving.service import ENGINE, engine_url
from testkit.serving import engine_settings


@pytest.fixture(scope="module")
def optimizer_engine(tmp_path_factory, base_model_dir) -> str:
    """Base URL (no /v1) of the real embedded engine: the agents' policy through the gateway,
    the optimiser LLM and the engine candidates are scored on."""
    settings = engine_settings(tmp_path_factory.mktemp("optimizer-engine"), base_model_dir)
    services.start(settings, ENGINE)
    yield engine_url(settings)
    services.stop(settings, ENGINE.name)
