"""`python -m tracetrain.base_model`, which docker-compose.yml's one-shot `base-model` runs: it
prints the folder the learner and the engines load, and fails naming a base model it cannot
resolve. A local folder stands in for the default model, whose conversion loads transformers."""

from __future__ import annotations

import os
import subprocess
import sys

from tracetrain.base_model import model_dir


def _run(base_model: str, home) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACETRAIN_")}
    env.update(TRACETRAIN_CONFIG="/nonexistent/tracetrain.toml", TRACETRAIN_HOME=str(home),
               TRACETRAIN_BASE_MODEL=base_model)
    return subprocess.run([sys.executable, "-m", "tracetrain.base_model"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_prints_the_folder_the_learner_loads(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    result = _run(str(folder), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(model_dir(str(folder), tmp_path)) == str(folder)


def test_a_folder_without_a_model_fails_naming_it(tmp_path):
    result = _run(str(tmp_path / "absent"), tmp_path)
    assert result.returncode != 0
    assert "absent" in result.stderr and "config.json" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_default_model_lives_under_the_homes_models_folder(tmp_path):
    assert model_dir("smollm2-135m-instruct", tmp_path) == tmp_path / "models" / "smollm2-135m-instruct"
