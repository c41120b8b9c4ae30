"""Rollout modes and sampling temperatures end to end: agents call the real gateway (in front
of the fixed upstream, the engine double) with and without a mode, send rewards through its
reward API, and the real worker process turns the spans into transitions: each carries the
temperature the engine sampled it at, and `val` rollouts never become transitions."""

from __future__ import annotations

import time

import httpx
import pytest
from pydantic import SecretStr

from infra import processes
from schemas import Codec
from testkit.fixed_upstream import ServerThread
from testkit.fixed_upstream import app as fixed_upstream
from testkit.metrics import get_state
from testkit.producers import running_gateway
from testkit.streams import consume

pytestmark = pytest.mark.integration


@pytest.fixture
def gateway(streams_settings, tmp_path):
    upstream = ServerThread(fixed_upstream(), processes.free_port()).start()
    with running_gateway(streams_settings, upstream.url + "/v1", tmp_path / "spool", "gw-modes",
                         api_keys=[SecretStr("k")], train_temperature=0.7) as (url, _, pub):
        yield url, pub
    upstream.stop()


def test_transitions_carry_the_sampling_temperature_and_val_rollouts_none(
        streams_settings, workers, gateway):
    url, pub = gateway
    worker = workers(streams_settings)
    auth = {"Authorization": "Bearer k"}
    # (rollout, path prefix, mode header, client temperature): two calls each, then a reward.
    rollouts = [("ro-train", "", "train", 0.1), ("ro-val", "/rollouts/ro-val/val", None, 1.0),
                ("ro-prod", "", None, 0.4), ("ro-greedy", "", None, 0)]
    with httpx.Client(timeout=30) as http:
        for rid, prefix, mode, temperature in rollouts:
            headers = {**auth, "X-Rollout-Id": rid, **({"X-Rollout-Mode": mode} if mode else {})}
            for turn in range(2):
                resp = http.post(f"{url}{prefix}/v1/chat/completions", headers=headers, json={
                    "model": "fixed-model", "temperature": temperature,
                    "messages": [{"role": "user", "content": f"turn {turn}"}]})
                assert resp.status_code == 200, resp.text
            resp = http.post(f"{url}/v1/rewards", headers=auth,
                             json={"rollout_id": rid, "value": 1.0, "final": True})
            assert resp.status_code == 202, resp.text
    assert pub.flush(20) == 0
    codec = Codec()
    got = consume(streams_settings, "transitions", lambda r: len(r) >= 6, timeout_s=90)
    got += consume(streams_settings, "transitions", lambda r: False, timeout_s=3.0)[len(got):]
    temperatures = {}
    for _, value, _ in got:
        t = codec.decode(value, "Transition")
        temperatures.setdefault(t["rollout_id"], []).append(t["sampling_temperature"])
    # train: forced to gateway.train_temperature; no mode: as sampled, greedy recorded as 0.
    assert temperatures == {"ro-train": [0.7, 0.7], "ro-prod": [0.4, 0.4],
                            "ro-greedy": [0.0, 0.0]}
    deadline = time.monotonic() + 30
    while (state := get_state(f"http://{worker.address}"))["val_rollouts"] < 1:
        assert time.monotonic() < deadline, state
        time.sleep(0.5)
    assert state["val_rollouts"] == 1 and state["output_transitions"] == 6
    assert state["closed_rollouts"].get("final") == 4
