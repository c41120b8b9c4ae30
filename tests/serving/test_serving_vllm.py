"""The vLLM path. vLLM needs CUDA, so on CPU machines a TEST DOUBLE of vLLM's HTTP API (a small
real HTTP server below, not vLLM) records the exact requests the reloader sends; the GPU test
runs the same path against real `vllm serve` and skips without CUDA."""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra import processes
from serving.reloader import Reloader
from serving.vllm import vllm_argv, vllm_env
from testkit.serving import make_adapters, register_version
from tracetrain.settings import load_settings
from tracetrain.settings.infra import MlflowSettings
from tracetrain.settings.serving import EngineSettings, ReloaderSettings


class VllmDouble(BaseHTTPRequestHandler):
    """Test double of vLLM's OpenAI server: answers like vLLM, records every call."""

    calls: list = []
    loras: dict = {}

    def _reply(self, status: int, body) -> None:
        data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.calls.append(("GET", self.path, None))
        if self.path == "/v1/models":
            data = [{"id": "smollm2", "object": "model", "root": "/base", "parent": None}]
            data += [{"id": n, "object": "model", "root": p, "parent": "smollm2"}
                     for n, p in self.loras.items()]
            return self._reply(200, {"object": "list", "data": data})
        self._reply(200, {})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(("POST", self.path, body))
        if self.path == "/v1/load_lora_adapter":
            self.loras[body["lora_name"]] = body["lora_path"]
            return self._reply(200, f"Success: LoRA adapter '{body['lora_name']}' added "
                                    "successfully.")
        if self.path == "/collective_rpc":
            return self._reply(200, {"results": [None]})
        self._reply(404, {"error": "not in the double"})

    def log_message(self, *args):
        pass


@pytest.fixture
def vllm_double():
    VllmDouble.calls, VllmDouble.loras = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", processes.free_port()), VllmDouble)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


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
    name = f"vllm-{uuid.uuid4().hex[:6]}"
    settings = load_settings(
        home=tmp_path, base_model=str(base_model_dir), engine=EngineSettings(backend="vllm"),
        mlflow=MlflowSettings(port=mlflow_server.port, registered_model=name),
        reloader=ReloaderSettings(alias="production", poll_s=0.1, engine_url=vllm_double))
    adapter = make_adapters(base_model_dir, tmp_path / "adapters", seeds=[3])[0]
    first = register_version(mlflow_server.uri, name, adapter)
    state = Reloader(settings).run(max_seconds=60, max_loads=1)
    local = str(tmp_path / "reloader" / "versions" / str(first) / "adapter")
    assert state.serving_version == first
    posts = [c for c in VllmDouble.calls if c[0] == "POST"]
    assert posts == [("POST", "/v1/load_lora_adapter",
                      {"lora_name": "policy", "lora_path": local, "load_inplace": True})]
    # After the load the reloader reads /v1/models to see the adapter's new root.
    after = VllmDouble.calls[VllmDouble.calls.index(posts[0]) + 1:]
    assert after and after[0][:2] == ("GET", "/v1/models")

    full = tmp_path / "full"
    full.mkdir()
    (full / "config.json").write_text(json.dumps({"model_type": "llama"}))
    second = register_version(mlflow_server.uri, name, full)
    VllmDouble.calls.clear()
    state = Reloader(settings).run(max_seconds=60, max_loads=1)
    assert state.serving_version == second
    posts = [c for c in VllmDouble.calls if c[0] == "POST"]
    assert posts == [("POST", "/collective_rpc", {
        "method": "reload_weights",
        "kwargs": {"weights_path": str(tmp_path / "reloader" / "versions" / str(second) /
                                       "adapter")}})]


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

    name = f"vllm-{uuid.uuid4().hex[:6]}"
    settings = load_settings(
        home=tmp_path, base_model=str(base_model_dir), engine=EngineSettings(backend="vllm"),
        mlflow=MlflowSettings(port=mlflow_server.port, registered_model=name),
        reloader=ReloaderSettings(alias="production", poll_s=0.1, engine_url=vllm_double))
    old, new = make_adapters(base_model_dir, tmp_path / "adapters", seeds=[6, 7])
    first = register_version(mlflow_server.uri, name, old)
    second = register_version(mlflow_server.uri, name, new)
    reloader = Reloader(settings)
    assert reloader.step() and reloader.state.serving_version == second
    VllmDouble.loras.clear()  # the engine restarted and forgot the adapter
    assert reloader.step(), "the reloader must notice and load the version again"
    loads = [c for c in VllmDouble.calls if c[1] == "/v1/load_lora_adapter"]
    assert len(loads) == 2 and loads[0] == loads[1]
    MlflowClient(mlflow_server.uri).set_registered_model_alias(name, "production", first)
    assert not reloader.step()  # the alias moved back: stay on the newer version
    assert reloader.state.serving_version == second
    assert len([c for c in VllmDouble.calls if c[1] == "/v1/load_lora_adapter"]) == 2
