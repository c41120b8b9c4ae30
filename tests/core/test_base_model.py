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


def _hf_cache_with(home, repo_id: str, files: dict[str, str]):
    """A Hugging Face hub cache (HF_HOME) holding one snapshot of `repo_id`, laid out as
    `huggingface_hub` writes it: blobs, a snapshot folder per revision, refs/main."""
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def test_a_hugging_face_id_resolves_to_its_cached_snapshot_and_is_never_downloaded(
        tmp_path, monkeypatch):
    hf_home = tmp_path / "hf"
    snapshot = _hf_cache_with(hf_home, "acme/tiny-llama", {"config.json": "{}"})
    monkeypatch.setenv("HF_HOME", str(hf_home))  # _run's child inherits it
    result = _run("acme/tiny-llama", tmp_path)
    missing = _run("acme/not-cached", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(snapshot)
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "acme/not-cached" in missing.stderr and "HF_HOME" in missing.stderr
