"""The vLLM path. vLLM needs CUDA, so on CPU machines a TEST DOUBLE of vLLM's HTTP API
(testkit/vllm_double.py: a small real HTTP server, not vLLM) records the exact requests the
reloader sends; the GPU test runs the same path against real `vllm serve` and skips without
CUDA."""

from __future__ import annotations

import json
import uuid

import pytest

from infra import processes
from serving.reloader import Reloader
from serving.vllm import vllm_argv, vllm_env
from testkit.fixed_upstream import ServerThread
from testkit.serving import make_adapters, register_version
from testkit.vllm_double import VllmDouble
from tracetrain.settings import load_settings
from tracetrain.settings.infra import MlflowSettings
from tracetrain.settings.serving import EngineSettings, ReloaderSettings


@pytest.fixture
def vllm_double():
    """The vLLM double of testkit (a real HTTP server, not vLLM): (url, double)."""
    double = VllmDouble()
    server = ServerThread(double.app(), processes.free_port()).start()
    yield server.url, double
    server.stop()


def test_launcher_argv_enables_runtime_lora_and_processed_logprobs(tmp_path, base_model_dir):
    settings = load_settings(home=tmp_path, base_model=str(base_model_dir),
                             engine=EngineSettings(backend="vllm", port=8123, max_lora_rank=16))
    argv = vllm_argv(settings)
    assert argv[1:3] == ["serve", str(base_model_dir)]
    joined = " ".join(argv)
    assert "--enable-lora" in argv and "--max-lora-rank 16" in joined
    assert "--logprobs-mode processed_logprobs" in joined and "--port 8123" in joined
    assert vllm_env()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"


@pytest.mark.mlflow
def test_reloader_drives_vllm_with_its_exact_endpoints(vllm_double, mlflow_server, tmp_path,
                                                     base_model_dir):
    url, double = vllm_double
    name = f"vllm-{uuid.uuid4().hex[:6]}"
    settings = load_settings(
        home=tmp_path, base_model=str(base_model_dir), engine=EngineSettings(backend="vllm"),
        mlflow=MlflowSettings(port=mlflow_server.port, registered_model=name),
        reloader=ReloaderSettings(alias="production", poll_s=0.1, engine_url=url))
    adapter = make_adapters(base_model_dir, tmp_path / "adapters", seeds=[3])[0]
    first = register_version(mlflow_server.uri, name, adapter)
    state = Reloader(settings).run(max_seconds=60, max_loads=1)
    versions = tmp_path / "reloader" / "versions" / name  # a folder per registered model
    local = str(versions / str(first) / "adapter")
    assert state.serving_version == first
    posts = [c for c in double.calls if c[0] == "POST"]
    # The plain name for direct clients, and the name that carries the policy version (the
    # registered version here: no policy_version tag) to the gateway's spans.
    load = {"lora_path": local, "load_inplace": True}
    assert posts == [("POST", "/v1/load_lora_adapter", {"lora_name": "policy", **load}),
                     ("POST", "/v1/load_lora_adapter", {"lora_name": f"policy-v{first}", **load})]
    # After the load the reloader reads /v1/models to see the adapters' new root.
    after = double.calls[double.calls.index(posts[-1]) + 1:]
    assert after and after[0][:2] == ("GET", "/v1/models")

    full = tmp_path / "full"
    full.mkdir()
    (full / "config.json").write_text(json.dumps({"model_type": "llama"}))
    second = register_version(mlflow_server.uri, name, full)
    double.calls.clear()
    state = Reloader(settings).run(max_seconds=60, max_loads=1)
    assert state.serving_version == second
    posts = [c for c in double.calls if c[0] == "POST"]
    assert posts == [("POST", "/collective_rpc", {
        "method": "reload_weights",
        "kwargs": {"weights_path": str(versions / str(second) / "adapter")}})]


def test_vllm_keeps_the_two_newest_versioned_adapters_loaded(vllm_double, tmp_path):
    from serving.engine_client import EngineClient

    url, double = vllm_double
    client = EngineClient(url, "vllm")
    for version in (3, 4, 5):
        folder = str(tmp_path / f"v{version}")
        client.load_lora(folder, version)
        assert client.serves(folder, version)
    assert double.loras == {"policy": str(tmp_path / "v5"), "policy-v4": str(tmp_path / "v4"),
                            "policy-v5": str(tmp_path / "v5")}
    assert [c[2] for c in double.calls if c[1] == "/v1/unload_lora_adapter"] == [
        {"lora_name": "policy-v3"}]
    assert not client.serves(str(tmp_path / "v4"), 4)  # the plain name moved on


@pytest.mark.gpu
def test_real_vllm_serves_a_reloaded_adapter(tmp_path, base_model_dir):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA and the gpu extra (vllm)")
    pytest.importorskip("vllm")
    import httpx

    from infra import services
    from serving.engine_client import EngineClient
    from serving.service import ENGINE, engine_url

    settings = load_settings(home=tmp_path, base_model=str(base_model_dir),
                             engine=EngineSettings(backend="vllm", port=processes.free_port(),
                                                   start_timeout_s=600))
    services.start(settings, ENGINE)
    try:
        url = engine_url(settings)
        ask = {"model": str(base_model_dir), "messages": [{"role": "user", "content": "Hi"}],
               "max_tokens": 8, "temperature": 0, "logprobs": True, "return_token_ids": True}
        before = httpx.post(f"{url}/v1/chat/completions", json=ask, timeout=120).json()
        adapter = make_adapters(base_model_dir, tmp_path / "adapters", seeds=[5])[0]
        client = EngineClient(url, "vllm")
        client.load_lora(str(adapter), 1)
        assert client.serves(str(adapter), 1)
        after = httpx.post(f"{url}/v1/chat/completions", json={**ask, "model": "policy"},
                           timeout=120).json()
        assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]
        assert after["choices"][0]["logprobs"]["content"]
    finally:
        services.stop(settings, ENGINE.name)


@pytest.mark.mlflow
def test_reloader_reloads_after_an_engine_restart_and_never_moves_backwards(
        vllm_double, mlflow_server, tmp_path, base_model_dir):
    from mlflow import MlflowClient

    url, double = vllm_double
    name = f"vllm-{uuid.uuid4().hex[:6]}"
    settings = load_settings(
        home=tmp_path, base_model=str(base_model_dir), engine=EngineSettings(backend="vllm"),
        mlflow=MlflowSettings(port=mlflow_server.port, registered_model=name),
        reloader=ReloaderSettings(alias="production", poll_s=0.1, engine_url=url))
    old, new = make_adapters(base_model_dir, tmp_path / "adapters", seeds=[6, 7])
    first = register_version(mlflow_server.uri, name, old)
    second = register_version(mlflow_server.uri, name, new)
    reloader = Reloader(settings)
    assert reloader.step() and reloader.state.serving_version == second
    double.loras.clear()  # the engine restarted and forgot the adapter
    assert reloader.step(), "the reloader must notice and load the version again"
    loads = [c for c in double.calls if c[1] == "/v1/load_lora_adapter"]
    assert len(loads) == 4 and loads[:2] == loads[2:]  # plain and versioned, twice
    MlflowClient(mlflow_server.uri).set_registered_model_alias(name, "production", first)
    assert not reloader.step()  # the alias moved back: stay on the newer version
    assert reloader.state.serving_version == second
    assert len([c for c in double.calls if c[1] == "/v1/load_lora_adapter"]) == 4
