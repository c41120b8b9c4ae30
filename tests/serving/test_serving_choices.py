"""Calls with `n > 1` through the gateway in front of the real embedded engine: every choice is
recorded as a span of the rollout, which the real streams worker turns into a transition of
its own (the engine's own answer to `n` is tested in test_serving_engine.py)."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import SecretStr

from schemas import Codec
from testkit.producers import consume as consume_spans
from testkit.producers import running_gateway
from testkit.streams import consume

QUESTION = [{"role": "user", "content": "Name a fruit and say why you like it."}]
BODY = {"model": "policy", "messages": QUESTION, "max_tokens": 10, "temperature": 1.0,
        "seed": 11}


def _streamed(response: httpx.Response) -> dict[int, list[int]]:
    """Token ids per choice index of an SSE stream."""
    tokens: dict[int, list[int]] = {}
    for line in response.iter_lines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                tokens.setdefault(choice["index"], []).extend(choice["token_ids"])
    return tokens


@pytest.fixture
def gateway(streams_settings, engine_url, tmp_path):
    with running_gateway(streams_settings, engine_url + "/v1", tmp_path / "spool", "gw-choices",
                         api_keys=[SecretStr("k")]) as (url, _, pub):
        yield url, pub


def test_every_choice_is_a_span_of_the_rollout_and_becomes_a_transition(
        streams_settings, workers, gateway):
    url, pub = gateway
    workers(streams_settings)
    auth = {"Authorization": "Bearer k"}
    with httpx.Client(base_url=f"{url}/rollouts/ro-n", headers=auth, timeout=120) as http:
        plain = http.post("/v1/chat/completions", json={**BODY, "n": 3})
        assert plain.status_code == 200, plain.text
        with http.stream("POST", "/v1/chat/completions",
                         json={**BODY, "n": 2, "seed": 5, "stream": True}) as response:
            assert response.status_code == 200
            streamed = _streamed(response)
            streamed_ids = response.headers["x-span-ids"].split(",")
        refused = http.post("/v1/chat/completions", json={**BODY, "n": 0})
        reward = http.post(f"{url}/v1/rewards", json={"rollout_id": "ro-n", "value": 1.0})
    assert refused.status_code == 422 and "'n' must be an integer from 1" in refused.text
    assert reward.status_code == 202, reward.text
    plain_ids = plain.headers["x-span-ids"].split(",")
    assert plain.headers["x-span-id"] == plain_ids[0]
    # span id -> the token ids the client got for that choice
    answered = {span_id: choice["token_ids"]
                for span_id, choice in zip(plain_ids, plain.json()["choices"], strict=True)}
    answered.update({span_id: streamed[i] for i, span_id in enumerate(streamed_ids)})
    assert len(answered) == 5 and len(set(map(tuple, answered.values()))) > 1

    assert pub.flush(20) == 0
    spans = [s for _, s in consume_spans(streams_settings.kafka.bootstrap_servers,
                                         streams_settings.topics.spans, 5, settle_s=1.0)]
    assert sorted(s["span_id"] for s in spans) == sorted(answered)
    for span in spans:
        llm = span["llm"]
        assert span["rollout_id"] == "ro-n" and span["status"] == "ok"
        assert llm["response_token_ids"] == answered[span["span_id"]]
        assert len(llm["response_logprobs"]) == len(llm["response_token_ids"])
        total = "3" if span["span_id"] in plain_ids else "2"
        assert span["attributes"]["choices"] == total
        chosen = plain_ids if total == "3" else streamed_ids
        assert span["attributes"]["choice_index"] == str(chosen.index(span["span_id"]))

    codec = Codec()
    got = consume(streams_settings, "transitions", lambda r: len(r) >= 5, timeout_s=90)
    got += consume(streams_settings, "transitions", lambda r: False, timeout_s=3.0)[len(got):]
    transitions = [codec.decode(value, "Transition") for _, value, _ in got]
    assert sorted(t["span_id"] for t in transitions) == sorted(answered)
    for t in transitions:
        assert t["rollout_id"] == "ro-n" and t["final_reward"] == 1.0
        assert t["response_token_ids"] == answered[t["span_id"]]
        assert len(t["behaviour_logprobs"]) == len(t["response_token_ids"])
