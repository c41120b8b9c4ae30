"""Serving fixtures: one real embedded engine process per session and the model for reference
forward passes (the helpers that make and register adapters are in testkit.serving)."""

from __future__ import annotations

import pytest

from infra import services
from serving.service import ENGINE
from serving.service import engine_url as _engine_url
from testkit.serving import engine_settings


@pytest.fixture(scope="session")
def engine_proc(tmp_path_factory, base_model_dir):
    """The real embedded engine (`python -m serving.engine`) on a free port."""
    home = tmp_path_factory.mktemp("engine-home")
    settings = engine_settings(home, base_model_dir)
    services.start(settings, ENGINE)
    yield settings
    services.stop(settings, ENGINE.name)


@pytest.fixture(scope="session")
def engine_url(engine_proc) -> str:  # noqa: F811 (the fixture is named as the function)
    return _engine_url(engine_proc)


@pytest.fixture(scope="session")
def reference(base_model_dir):
    """The same weights, loaded in the test process, for forward-pass comparisons."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir).eval()
    return model, tokenizer
