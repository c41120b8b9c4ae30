"""Fixtures of the example agents' tests."""

from __future__ import annotations

import pytest

from infra import processes, services
from serving.service import ENGINE
from serving.service import engine_url as service_url
from tracetrain.settings import load_settings
from tracetrain.settings.serving import EngineSettings


@pytest.fixture(scope="session")
def engine_url(tmp_path_factory, base_model_dir):
    """The real embedded engine on the default model, on a free port."""
    settings = load_settings(home=tmp_path_factory.mktemp("examples-engine"),
                             base_model=str(base_model_dir),
                             engine=EngineSettings(port=processes.free_port()))
    services.start(settings, ENGINE)
    yield service_url(settings)
    services.stop(settings, ENGINE.name)
