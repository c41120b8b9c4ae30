"""One reloader, a pool of engines: each version reaches every engine, an engine that is down
during a load gets it when it answers again, and the state says which engine serves what.
The engines are testkit's vLLM DOUBLE (small real HTTP servers, not vLLM) and the versions
local folders (MLflow reads a local artifact URI without its server); two real embedded
engines behind a real gateway are tests/serving/test_serving_pool.py."""

from __future__ import annotations

import json

import pytest
from fastapi.responses import JSONResponse

from infra import processes
from serving.reloader import Reloader, Target
from testkit.fixed_upstream import ServerThread
from testkit.metrics import metric_samples
from testkit.vllm_double import VllmDouble
from tracetrain.settings import load_settings
from tracetrain.settings.serving import EngineSettings, ReloaderSettings


class Engine:
    """A vLLM double on a port of its own, which a test can stop and start again (empty, as a
    restarted engine is)."""

    def __init__(self) -> None:
        self.port = processes.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        self.double = VllmDouble()
        self.server = ServerThread(self.double.app(), self.port).start()

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def pool():
    engines = [Engine(), Engine()]
    yield engines
    for engine in engines:
        engine.stop()


def _version(tmp_path, number: int) -> Target:
    folder = tmp_path / "registry" / f"v{number}" / "adapter"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}))
    return Target(number, str(folder.parent), policy_version=number)


def _reloader(tmp_path, urls: list[str]) -> Reloader:
    settings = load_settings(home=tmp_path, engine=EngineSettings(backend="vllm"),
                             reloader=ReloaderSettings(engine_urls=urls, poll_s=0.1,
                                                       verify_timeout_s=2))
    return Reloader(settings)


def test_every_engine_of_the_pool_loads_each_version_and_a_late_one_catches_up(tmp_path, pool):
    first, second = pool
    reloader = _reloader(tmp_path, [first.url, second.url])
    target = _version(tmp_path, 1)
    reloader.target = lambda: target
    assert reloader.step()
    path = str(reloader.downloads / "1" / "v1" / "adapter")
    for engine in pool:
        assert engine.double.loras == {"policy": path, "policy-v1": path}
    state = reloader.state
    assert state.converged and state.serving_version == 1
    assert {url: seen["serving_version"] for url, seen in state.engines.items()} == \
        {first.url: 1, second.url: 1}
    assert [load["engine"] for load in state.loads] == [first.url, second.url]
    assert not reloader.step()  # nothing to do: no engine is loaded again
    assert len([c for e in pool for c in e.double.calls if c[1] == "/v1/load_lora_adapter"]) == 4

    second.stop()  # down while the next version rolls out
    target = _version(tmp_path, 2)
    assert not reloader.step()
    assert first.double.loras["policy"].endswith("/2/v2/adapter")
    assert not state.converged and state.serving_version == 2
    assert state.engines[first.url]["serving_version"] == 2
    assert "did not" in state.engines[second.url]["error"]
    samples = metric_samples(reloader.metrics.metrics.exposition().decode())
    assert samples["tracetrain_reloader_converged_value", {}] == 0
    assert samples["tracetrain_reloader_engine_serving_version", {"engine": first.url}] == 2
    assert samples["tracetrain_reloader_engine_serving_version", {"engine": second.url}] == 1

    second.start()  # back, having forgotten every adapter (a restarted engine)
    assert reloader.step()
    assert second.double.loras["policy"].endswith("/2/v2/adapter")
    assert state.converged and state.engines[second.url]["error"] is None
    assert [c[1] for c in first.double.calls[-1:]] == ["/v1/models"]  # only asked, not loaded
    saved = json.loads((tmp_path / "reloader" / "state.json").read_text())
    assert saved["converged"] and saved["engines"][second.url]["serving_version"] == 2


def test_a_version_an_engine_refuses_goes_no_further(tmp_path, pool):
    """The first engine refuses the load (a 4xx: the version is to blame, not the engine):
    the second never gets it, and the attempt counts against the version."""
    first, second = pool

    async def refuse() -> JSONResponse:
        return JSONResponse({"error": {"message": "bad adapter"}}, status_code=400)

    routes = first.server.app.router.routes  # the double's load route gives way to `refuse`
    routes[:] = [r for r in routes if getattr(r, "path", "") != "/v1/load_lora_adapter"]
    first.server.app.add_api_route("/v1/load_lora_adapter", refuse, methods=["POST"])
    reloader = _reloader(tmp_path, [first.url, second.url])
    target = _version(tmp_path, 1)
    reloader.target = lambda: target
    assert not reloader.step()
    assert all(call[1] != "/v1/load_lora_adapter" for call in second.double.calls)
    assert reloader.state.attempts == {"1": 1} and not reloader.state.converged
    assert "bad adapter" in reloader.state.engines[first.url]["error"]
