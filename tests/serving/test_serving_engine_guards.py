"""What the real engine refuses before any work, on an engine of its own with one slot and
room for one request: a second request (429), a client that left (its generation is cancelled
in llama-server, so the slot frees at once), loads without the key or from outside the
reloader's download folder."""

from __future__ import annotations

import time

import httpx
import pytest

from infra import processes, services
from serving.access import download_dir, load_key
from serving.service import ENGINE, engine_url
from testkit.serving import engine_settings

# Long enough that nothing ends it but the disconnect: 1500 tokens past any end of text take a
# minute or more on two cores; the short request after it takes a second or two.
LONG = {"model": "policy", "prompt": "Count from 1 to 1000, separated by commas: 1, 2, 3,",
        "max_tokens": 1500, "temperature": 0, "ignore_eos": True}
SHORT = {"model": "policy", "prompt": "The capital of France is", "max_tokens": 2,
         "temperature": 0}
SLOT_FREE_S = 20.0


@pytest.fixture(scope="module")
def one_slot_engine(tmp_path_factory, base_model_dir):
    settings = engine_settings(tmp_path_factory.mktemp("one-slot-home"), base_model_dir,
                               slots=1, max_requests_per_slot=1)
    services.start(settings, ENGINE)
    yield settings
    services.stop(settings, ENGINE.name)


def _idle(url: str) -> None:
    """Wait until the engine holds no request (admitted or running)."""
    processes.wait_until(lambda: (lambda s: s.get("admitted", 0) == 0 and s["in_flight"] == 0)(
        httpx.get(f"{url}/state", timeout=5).json()), 10, "the engine to drop the request")


def _short_is_served_at_once(url: str) -> None:
    started = time.monotonic()
    response = httpx.post(f"{url}/v1/completions", json=SHORT, timeout=300)
    assert response.status_code == 200, response.text
    assert time.monotonic() - started < SLOT_FREE_S, "the slot was still generating for nobody"


def test_a_full_engine_answers_429_and_a_stream_whose_client_left_frees_its_slot(
        one_slot_engine):
    url = engine_url(one_slot_engine)
    with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True},
                      timeout=120) as stream:
        assert stream.status_code == 200, stream.read()
        lines = stream.iter_lines()  # kept: a dropped iterator closes the connection
        assert next(lines).startswith("data: {")  # it is generating
        full = httpx.post(f"{url}/v1/completions", json=SHORT, timeout=10)
    # leaving the block closed the stream after its first chunk
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    assert "engine.max_requests_per_slot = 1" in full.json()["error"]["message"]
    _idle(url)
    _short_is_served_at_once(url)
    text = httpx.get(f"{url}/metrics").text
    assert "tracetrain_engine_refused_full_calls_total 1.0" in text


def test_a_client_that_leaves_before_its_answer_frees_its_slot(one_slot_engine):
    url = engine_url(one_slot_engine)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json=LONG, timeout=httpx.Timeout(30, read=2))
    _idle(url)
    _short_is_served_at_once(url)


def test_loads_need_the_key_and_a_folder_under_the_download_folder(one_slot_engine, tmp_path):
    url, settings = engine_url(one_slot_engine), one_slot_engine
    key, downloads = load_key(settings), download_dir(settings)
    inside = downloads / "7"
    inside.mkdir(parents=True)
    (downloads / "escape").symlink_to(tmp_path)

    def load(path, authorization: bytes | None = f"Bearer {key}".encode(),
             route="/v1/load_lora_adapter") -> httpx.Response:
        headers = {"authorization": authorization} if authorization else {}
        return httpx.post(f"{url}{route}", headers=headers, timeout=60,
                          json={"lora_name": "policy", "lora_path": str(path), "path": str(path)})

    for authorization in (None, b"Bearer wrong", "Bearer schlüssel".encode(), key.encode()):
        for route in ("/v1/load_lora_adapter", "/v1/load_checkpoint"):
            refused = load(inside, authorization, route)
            assert refused.status_code == 401, refused.text
            assert refused.headers["www-authenticate"] == "Bearer"
            assert "Authorization: Bearer" in refused.json()["error"]["message"]
    for outside in (tmp_path, downloads / ".." / "..", downloads / "escape"):
        for route in ("/v1/load_lora_adapter", "/v1/load_checkpoint"):
            refused = load(outside, route=route)
            assert refused.status_code == 403, refused.text
            message = refused.json()["error"]["message"]
            assert repr(str(outside)) in message and repr(str(downloads)) in message
    # past both checks: an empty folder under the download folder is the loader's 400
    empty = load(inside)
    assert empty.status_code == 400 and "load of 'policy' failed" in empty.text
    assert httpx.get(f"{url}/v1/policy").json()["policy_version"] == 0
