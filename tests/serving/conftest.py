"""Serving fixtures: one real embedded engine process per session, the model for reference
forward passes, and helpers that make real PEFT adapters of the default model."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from infra import processes
from serving import services
from serving.config import EngineSettings
from tracetrain.settings import load_settings


def engine_settings(home: Path, model_dir: Path, **engine):
    return load_settings(home=home, base_model=str(model_dir),
                         engine=EngineSettings(port=processes.free_port(), **engine))


@pytest.fixture(scope="session")
def engine_proc(tmp_path_factory, base_model_dir):
    """The real embedded engine (`python -m serving.engine`) on a free port."""
    home = tmp_path_factory.mktemp("engine-home")
    settings = engine_settings(home, base_model_dir)
    services.start_engine(settings)
    yield settings
    processes.stop(settings.home_dir, services.ENGINE)


@pytest.fixture(scope="session")
def engine_url(engine_proc) -> str:
    return services.engine_url(engine_proc)


@pytest.fixture(scope="session")
def reference(base_model_dir):
    """The same weights, loaded in the test process, for forward-pass comparisons."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir).eval()
    return model, tokenizer


def policy_info(url: str) -> dict:
    return httpx.get(f"{url}/v1/policy", timeout=10).json()
