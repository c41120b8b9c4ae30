"""Hot reload through the real reloader, a real MLflow server and a real engine process."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from infra import processes, services
from serving.access import download_dir
from serving.reloader import Reloader
from serving.service import ENGINE, engine_url
from testkit.cutting_proxy import CuttingProxy
from testkit.metrics import check_metrics, get_state
from testkit.serving import (
    engine_settings,
    load_adapter,
    make_adapters,
    policy_info,
    register_version,
)
from tracetrain.settings.infra import MlflowSettings
from tracetrain.settings.serving import ReloaderSettings

pytestmark = pytest.mark.mlflow
ASK = {"model": "policy", "messages": [{"role": "user", "content": "What is the capital of France?"}],
       "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def reload_engine(tmp_path_factory, base_model_dir, mlflow_server):
    """A separate engine process: these tests change its weights."""
    home = tmp_path_factory.mktemp("reload-home")
    settings = engine_settings(home, base_model_dir)
    settings = settings.model_copy(update={
        "mlflow": MlflowSettings(port=mlflow_server.port,
                                 registered_model=f"policy-{uuid.uuid4().hex[:6]}"),
        "reloader": ReloaderSettings(alias="production", poll_s=0.2, max_attempts=2,
                                     retry_s=0.1)})
    services.start(settings, ENGINE)
    yield settings
    services.stop(settings, ENGINE.name)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, base_model_dir):
    return make_adapters(base_model_dir, tmp_path_factory.mktemp("adapters"), seeds=[1])


def ask(url: str) -> dict:
    response = httpx.post(f"{url}/v1/chat/completions", json=ASK, timeout=120)
    response.raise_for_status()
    body = response.json()
    assert body["policy_version"] == int(response.headers["x-policy-version"])
    return body


def test_new_version_is_loaded_under_load_without_a_failed_request(reload_engine, adapters):
    url = engine_url(reload_engine)
    before = ask(url)
    assert before["policy_version"] == 0
    stop, seen, failures = threading.Event(), [], []

    def client() -> None:
        versions = []
        while not stop.is_set():
            try:
                versions.append(ask(url)["policy_version"])
            except (httpx.HTTPError, AssertionError) as exc:
                failures.append(repr(exc))
        seen.append(versions)

    reloader = Reloader(reload_engine)
    with ThreadPoolExecutor(8) as pool:
        try:
            for _ in range(8):
                pool.submit(client)
            time.sleep(1.0)
            version = register_version(reload_engine.mlflow.uri,
                                       reload_engine.mlflow.registered_model, adapters[0])
            state = reloader.run(max_seconds=120, max_loads=1)
            time.sleep(3.0)  # let every client finish at least one call on the new version
        finally:
            stop.set()
    assert failures == []
    assert state.serving_version == version and state.loads[0]["seconds"] < 30
    for versions in seen:
        assert versions == sorted(versions), "a client saw the version go backwards"
    assert any(version in versions for versions in seen)
    after = ask(url)
    assert after["policy_version"] == version
    assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]


def test_corrupt_version_keeps_old_serving_and_is_not_retried_forever(reload_engine, adapters,
                                                                      tmp_path):
    url = engine_url(reload_engine)
    serving = ask(url)
    old = serving["policy_version"]
    assert old >= 1, "runs after the hot-reload test"
    broken = tmp_path / "broken"
    broken.mkdir()
    for part in adapters[0].iterdir():
        data = part.read_bytes()
        # Truncate the weights to half: the header promises bytes that are not there.
        (broken / part.name).write_bytes(data[: len(data) // 2] if part.suffix == ".safetensors"
                                         else data)
    version = register_version(reload_engine.mlflow.uri, reload_engine.mlflow.registered_model,
                               broken)
    # port 0: its status pages on a free port
    reloader = Reloader(reload_engine.model_copy(update={
        "reloader": reload_engine.reloader.model_copy(update={"metrics_port": 0})}))
    reloader.state.serving_version = old  # as a reloader that loaded `old` would remember
    with reloader.serve_status() as server:
        state = reloader.run(max_seconds=4)
        names = check_metrics(server.url, "reloader")
        text = httpx.get(f"{server.url}/metrics").text
        page = get_state(server.url)
    assert {"tracetrain_reloader_registry_polls_total", "tracetrain_reloader_broken_versions",
            "tracetrain_reloader_serving_version"} <= names
    attempts_made = reload_engine.reloader.max_attempts
    assert f'tracetrain_reloader_engine_loads_total{{outcome="failed"}} {attempts_made}.0' in text
    assert page["broken"] == state.broken and page["serving_version"] == old
    assert str(version) in state.broken
    assert "SafetensorsError" in state.broken[str(version)] or "cannot read" in \
        state.broken[str(version)]
    attempts = [load for load in policy_info(url)["loads"] if not load["ok"]]
    assert len(attempts) == reload_engine.reloader.max_attempts  # then it stopped trying
    assert "keeps serving" not in attempts[-1]["error"] and "cannot read" in attempts[-1]["error"]
    after = ask(url)
    assert after["policy_version"] == old
    assert after["choices"][0]["token_ids"] == serving["choices"][0]["token_ids"]


def test_a_restarted_reloader_remembers_what_it_serves_and_what_is_broken(reload_engine):
    """state.json outlives the process: a new reloader neither retries the broken version the
    alias still points at nor forgets the version it loaded."""
    url = engine_url(reload_engine)
    serving = ask(url)["policy_version"]
    failed_loads = len([load for load in policy_info(url)["loads"] if not load["ok"]])
    saved = json.loads((reload_engine.home_dir / "reloader" / "state.json").read_text())
    assert saved["broken"], "runs after the corrupt-version test"
    state = Reloader(reload_engine).run(max_seconds=2)
    assert len([load for load in policy_info(url)["loads"] if not load["ok"]]) == failed_loads
    assert state.broken == saved["broken"]
    assert state.serving_version == serving and ask(url)["policy_version"] == serving
    # ... but the state of another registered model (every one numbers its versions from 1)
    # is not this one's: it starts afresh, its downloads in a folder of its own
    other = reload_engine.model_copy(update={"mlflow": reload_engine.mlflow.model_copy(
        update={"registered_model": "another-model"})})
    fresh = Reloader(other)
    assert fresh.state.serving_version is None and not fresh.state.broken
    assert fresh.downloads == download_dir(other) / "another-model"
    assert Reloader(reload_engine).state.serving_version == serving


def test_in_flight_stream_finishes_on_the_version_it_started_on(reload_engine, adapters):
    """Blue/green: a stream that began before a swap ends on the old llama-server and says so;
    the next request is served by the new one."""
    url = engine_url(reload_engine)
    old = ask(url)["policy_version"]
    body = {"model": "policy", "stream": True, "max_tokens": 300, "temperature": 0,
            "messages": [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]}
    versions, swapped_at, last_chunk_at = [], None, None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data: {"):
                continue
            versions.append(json.loads(line[len("data: "):])["policy_version"])
            last_chunk_at = time.monotonic()
            if swapped_at is None:
                load = load_adapter(reload_engine, adapters[0], policy_version=old + 100)
                assert load.status_code == 200, load.text
                swapped_at = time.monotonic()
    assert set(versions) == {old}
    assert last_chunk_at > swapped_at, "the stream ended before the swap: nothing was tested"
    assert ask(url)["policy_version"] == old + 100
    assert policy_info(url)["draining"] == []  # the old server stopped once it was idle


def test_a_version_llama_server_refuses_leaves_the_old_one_serving(reload_engine, adapters,
                                                                   tmp_path):
    """An adapter that converts but that llama-server will not load (its shapes do not fit the
    model): the load is a 400 naming the failure and the serving version answers throughout."""
    from safetensors.numpy import load_file, save_file

    url = engine_url(reload_engine)
    serving = ask(url)
    misfit = tmp_path / "misfit"
    misfit.mkdir()
    (misfit / "adapter_config.json").write_bytes((adapters[0] / "adapter_config.json").read_bytes())
    tensors = load_file(str(adapters[0] / "adapter_model.safetensors"))
    save_file({key: (value[:, :100].copy() if "lora_A" in key else value)
               for key, value in tensors.items()}, str(misfit / "adapter_model.safetensors"))
    with ThreadPoolExecutor(4) as pool:
        answers = [pool.submit(ask, url) for _ in range(8)]
        load = load_adapter(reload_engine, misfit)
        answers = [future.result() for future in answers]
    assert load.status_code == 400
    assert "keeps serving" in load.text and "did not start" in load.text
    assert {a["policy_version"] for a in answers} == {serving["policy_version"]}
    after = ask(url)
    assert after["policy_version"] == serving["policy_version"]
    assert after["choices"][0]["token_ids"] == serving["choices"][0]["token_ids"]


@pytest.mark.faults
def test_a_download_cut_short_is_fetched_again_never_loaded_or_blamed(reload_engine, adapters,
                                                                      mlflow_server):
    """MLflow stops half-way through the adapter's weights: nothing half-downloaded is loaded,
    the version is not blamed, and the next poll fetches it whole and loads it."""
    mlflow = reload_engine.mlflow
    version = register_version(mlflow.uri, mlflow.registered_model, adapters[0])
    with CuttingProxy(mlflow.uri, processes.free_port(),
                      cut=lambda path: path.endswith(".safetensors")) as proxy:
        through_proxy = reload_engine.model_copy(update={
            "mlflow": mlflow.model_copy(update={"port": proxy.port})})
        reloader = Reloader(through_proxy)
        state = reloader.run(max_seconds=60, max_loads=1)
    assert len(proxy.cut_paths) == 1, "the transfer was never cut: nothing was tested"
    assert str(version) not in state.broken and str(version) not in state.attempts
    assert state.serving_version == version
    assert ask(engine_url(reload_engine))["policy_version"] == version
    weights = (adapters[0] / "adapter_model.safetensors").read_bytes()
    downloads = download_dir(reload_engine) / mlflow.registered_model
    assert [p.read_bytes() for p in (downloads / str(version)).rglob("*.safetensors")] \
        == [weights]
    assert list(downloads.glob(".*partial*")) == []  # nothing half-done left behind
    text = reloader.metrics.metrics.exposition()
    assert 'tracetrain_reloader_downloaded_versions_total{outcome="failed"} 1.0' in text.decode()
