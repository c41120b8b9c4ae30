"""Rewards are finite and within `settings.rewards.max_abs` at the producers' doors on the real
broker: `POST /v1/rewards` answers 422 naming the value and the bound (1e200 was accepted), the
tracer's `Rollout.reward` raises (it published NaN unchecked); the good reward sent after them
is the only one on the rewards topic."""

from __future__ import annotations

import httpx
import pytest

from producers.errors import ProducerError
from producers.publisher import Publisher
from producers.tracer import Tracer
from testkit.producers import consume

pytestmark = pytest.mark.integration


def _rewards(settings, pub) -> list[tuple[str, dict]]:
    assert pub.flush(20) == 0
    return consume(settings.kafka.bootstrap_servers, settings.topics.rewards, 1, name="Reward",
                   settle_s=1.0)


def test_the_reward_api_refuses_rewards_out_of_bounds(gateway):
    url, settings, pub = gateway
    auth = {"Authorization": "Bearer key-1", "Content-Type": "application/json"}
    for value, words in [("1e200", "1e+200: expected a number within ±1e+06 (rewards.max_abs)"),
                         ("-2000000", "rewards.max_abs"), ("NaN", "finite"),
                         ("-Infinity", "finite")]:
        resp = httpx.post(url + "/v1/rewards", headers=auth,
                          content=f'{{"rollout_id": "ro-bad", "value": {value}}}')
        assert resp.status_code == 422, (value, resp.status_code, resp.text)
        assert words in resp.text and "value" in resp.text, resp.text
    resp = httpx.post(url + "/v1/rewards", headers=auth, json={"rollout_id": "ro-ok",
                                                                "value": 1e6})
    assert resp.status_code == 202, resp.text
    assert [(key, r["value"]) for key, r in _rewards(settings, pub)] == [("ro-ok", 1e6)]


def test_the_tracer_refuses_rewards_out_of_bounds(kafka_settings, tmp_path):
    pub = Publisher(kafka_settings, name="tracer-bounds", spool_dir=tmp_path / "spool")
    tracer = Tracer(pub, agent="solver")
    with tracer.rollout() as r:
        for value in (float("nan"), float("inf"), 1e200, -1e7):
            with pytest.raises(ProducerError, match="value"):
                r.reward(value)
        assert not r.rewarded
        r.reward(0.5)
    try:
        assert [(key, rec["value"]) for key, rec in _rewards(kafka_settings, pub)] == \
            [(r.rollout_id, 0.5)]
    finally:
        pub.close(10)
