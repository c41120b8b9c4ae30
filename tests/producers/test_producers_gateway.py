"""The gateway with the official `openai` client against a real HTTP upstream (the fixed
server, standing in for vLLM); spans are read back from the real broker and decoded."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from testkit.fixed_upstream import POLICY_VERSION, PROMPT_IDS
from testkit.producers import consume

pytestmark = pytest.mark.integration
IDS = {"X-Rollout-Id": "ro-42", "X-Attempt-Id": "att-1", "X-Task-Id": "task-7",
       "X-Agent-Name": "solver", "X-Policy-Name": "calc"}


def _spans(settings, pub, n):
    assert pub.flush(20) == 0
    return [s for _k, s in consume(settings.kafka.bootstrap_servers, settings.topics.spans, n,
                                   settle_s=0.5)]


def _client(url, key="key-1", **kw):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, **kw)


def test_chat_non_streaming_span_carries_every_field(gateway):
    url, settings, pub = gateway
    client = _client(url, default_headers=IDS)
    msgs = [{"role": "user", "content": "Say hello"}]
    resp = client.chat.completions.create(model="fixed-model", messages=msgs)
    assert resp.choices[0].message.content == "Hello from the fixed upstream."
    [span] = _spans(settings, pub, 1)
    assert (span["rollout_id"], span["attempt_id"], span["task_id"], span["agent_name"],
            span["policy_name"]) == ("ro-42", "att-1", "task-7", "solver", "calc")
    assert span["kind"] == "llm" and span["status"] == "ok" and span["error_message"] is None
    assert span["end_time_ns"] > span["start_time_ns"] > 0
    llm = span["llm"]
    assert llm["model"] == "fixed-model" and llm["policy_version"] == POLICY_VERSION
    assert json.loads(llm["request_messages"]) == msgs
    assert llm["response_text"] == "Hello from the fixed upstream."
    assert llm["prompt_token_ids"] == PROMPT_IDS
    assert llm["response_token_ids"] == [100, 101, 102, 103, 104]
    assert llm["response_logprobs"] == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert llm["finish_reason"] == "stop"
    assert llm["usage"] == {"prompt_tokens": 5, "completion_tokens": 5}
    assert span["attributes"]["http.status_code"] == "200"


def test_chat_streaming_is_passed_through_and_assembled(gateway):
    url, settings, pub = gateway
    client = _client(url, default_headers=IDS)
    stream = client.chat.completions.create(
        model="fixed-model", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello from the fixed upstream."
    [span] = _spans(settings, pub, 1)
    llm = span["llm"]
    assert span["attributes"]["stream"] == "true"
    assert llm["response_text"] == text and llm["prompt_token_ids"] == PROMPT_IDS
    assert llm["response_token_ids"] == [100, 101, 102, 103, 104]
    assert llm["response_logprobs"] == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert llm["finish_reason"] == "stop" and llm["policy_version"] == POLICY_VERSION
    assert llm["usage"] == {"prompt_tokens": 5, "completion_tokens": 5}


def test_completions_under_rollout_path_prefix_and_models(gateway):
    url, settings, pub = gateway
    client = openai.OpenAI(base_url=url + "/rollouts/ro-path-1/v1", api_key="key-2",
                           max_retries=0)
    assert [m.id for m in client.models.list()] == ["fixed-model"]
    plain = client.completions.create(model="fixed-model", prompt="Capital of France?")
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="fixed-model", prompt="Capital of France?", stream=True) if c.choices)
    assert plain.choices[0].text == streamed == "Paris is the capital."
    spans = _spans(settings, pub, 2)
    assert [s["rollout_id"] for s in spans] == ["ro-path-1", "ro-path-1"]
    for s in spans:
        assert s["llm"]["response_text"] == "Paris is the capital."
        assert s["llm"]["response_token_ids"] == [100, 101, 102, 103]
        assert s["llm"]["response_logprobs"] == pytest.approx([-0.1, -0.2, -0.3, -0.4])
        assert json.loads(s["llm"]["request_messages"]) == "Capital of France?"


def test_generated_rollout_id_is_returned_and_upstream_error_recorded(gateway):
    url, settings, pub = gateway
    client = _client(url)
    raw = client.chat.completions.with_raw_response.create(
        model="fixed-model", messages=[{"role": "user", "content": "hi"}])
    generated = raw.headers["x-rollout-id"]
    assert generated.startswith("ro-")
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="fail-503", messages=[{"role": "user", "content": "x"}],
                                       extra_headers={"X-Rollout-Id": "ro-err"})
    assert err.value.status_code == 503 and "engine overloaded" in str(err.value)
    spans = {s["rollout_id"]: s for s in _spans(settings, pub, 2)}
    assert spans[generated]["attributes"]["rollout_id_generated"] == "true"
    bad = spans["ro-err"]
    assert bad["status"] == "error" and "engine overloaded" in bad["error_message"]
    assert bad["attributes"]["http.status_code"] == "503"


def test_bad_input_gets_clear_4xx_and_records_nothing(gateway):
    url, settings, pub = gateway
    auth = {"Authorization": "Bearer key-1", "Content-Type": "application/json"}
    chat = url + "/v1/chat/completions"
    cases = [
        (httpx.post(chat, content=b"{not json", headers=auth), 400, "not valid JSON"),
        (httpx.post(chat, json={"model": "m", "messages": "hi"}, headers=auth), 422, "'messages'"),
        (httpx.post(chat, json={"model": 3, "messages": []}, headers=auth), 422, "'model'"),
        (httpx.post(chat, json={"model": "m", "messages": [{"role": "user"}], "stream": "yes"},
                    headers=auth), 422, "'stream'"),
        (httpx.post(chat, content=b"x" * (65 * 1024), headers=auth), 413, "exceeds the limit"),
        (httpx.post(chat, json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                    headers={**auth, "X-Rollout-Id": "bad id/with spaces"}), 400, "X-Rollout-Id"),
        (httpx.post(chat, json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                    headers={"Authorization": "Bearer wrong"}), 401, "API key"),
        (httpx.post(url + "/v1/rewards", json={"rollout_id": "ro-1", "value": "high"},
                    headers=auth), 422, "value"),
        (httpx.post(url + "/v1/rewards", json={"value": 1.0}, headers=auth), 422, "rollout_id"),
    ]
    for resp, status, words in cases:
        assert resp.status_code == status, (resp.status_code, resp.text)
        assert words in resp.text, resp.text
    # Still serving: a good call goes through, and it is the only span recorded.
    ok = _client(url).chat.completions.create(model="fixed-model",
                                              messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].message.content
    assert len(_spans(settings, pub, 1)) == 1


def test_reward_api_publishes_rewards(gateway):
    url, settings, pub = gateway
    resp = httpx.post(url + "/v1/rewards", headers={"Authorization": "Bearer key-2"},
                      json={"rollout_id": "ro-9", "value": 1, "final": True, "name": "exact",
                            "span_id": "abc"})
    assert resp.status_code == 202, resp.text
    assert pub.flush(20) == 0
    [(key, reward)] = consume(settings.kafka.bootstrap_servers, settings.topics.rewards, 1,
                              name="Reward", settle_s=0.5)
    assert key == "ro-9" and reward["value"] == 1.0 and reward["final"] is True
    assert reward["name"] == "exact" and reward["span_id"] == "abc"


def test_upstream_refusing_token_ids_is_retried_plain(gateway):
    url, settings, pub = gateway
    client = _client(url, default_headers={"X-Rollout-Id": "ro-strict"})
    for _ in range(2):  # the second call goes plain at once
        resp = client.chat.completions.create(model="strict-model",
                                              messages=[{"role": "user", "content": "hi"}])
        assert resp.choices[0].message.content == "Hello from the fixed upstream."
    spans = _spans(settings, pub, 2)
    assert all(s["status"] == "ok" and s["llm"]["response_token_ids"] == [] for s in spans)
    assert all(s["llm"]["response_text"] == "Hello from the fixed upstream." for s in spans)


def test_rollout_modes_force_the_temperature_the_engine_gets_and_the_span_records(
        make_gateway, upstream):
    url, settings, pub = make_gateway(train_temperature=0.8)
    received = upstream.app.state.received
    received.clear()
    msgs = [{"role": "user", "content": "hi"}]
    # train (header) over the client's 0.2; val (path segment, streamed) over 0.9; no mode:
    # as sent, and the engines' default 1.0 sent explicitly when the client gives none.
    _client(url, default_headers={"X-Rollout-Id": "ro-train", "X-Rollout-Mode": "Train"}) \
        .chat.completions.create(model="fixed-model", messages=msgs, temperature=0.2)
    val = openai.OpenAI(base_url=url + "/rollouts/ro-val/val/v1", api_key="key-1", max_retries=0)
    assert "".join(c.choices[0].delta.content or "" for c in val.chat.completions.create(
        model="fixed-model", messages=msgs, temperature=0.9, stream=True) if c.choices)
    plain = _client(url)
    plain.chat.completions.create(model="fixed-model", messages=msgs, temperature=0.3,
                                  extra_headers={"X-Rollout-Id": "ro-sent"})
    plain.completions.create(model="fixed-model", prompt="Capital?",
                             extra_headers={"X-Rollout-Id": "ro-default"})
    assert [b["temperature"] for b in received] == [0.8, 0.0, 0.3, 1.0]
    spans = {s["rollout_id"]: s["attributes"] for s in _spans(settings, pub, 4)}
    assert {r: (a["gen_ai.request.temperature"], a.get("tracetrain.rollout_mode"))
            for r, a in spans.items()} == {"ro-train": ("0.8", "train"), "ro-val": ("0.0", "val"),
                                           "ro-sent": ("0.3", None),
                                           "ro-default": ("1.0", None)}


def test_an_unknown_rollout_mode_is_a_400_naming_it_and_the_modes(gateway, upstream):
    url, settings, pub = gateway
    upstream.app.state.received.clear()
    auth = {"Authorization": "Bearer key-1"}
    body = {"model": "fixed-model", "messages": [{"role": "user", "content": "x"}]}
    by_header = httpx.post(url + "/v1/chat/completions", json=body,
                           headers={**auth, "X-Rollout-Mode": "eval"})
    by_path = httpx.post(url + "/rollouts/ro-1/greedy/v1/completions", headers=auth,
                         json={"model": "fixed-model", "prompt": "x"})
    for resp, value in ((by_header, "'eval'"), (by_path, "'greedy'")):
        assert resp.status_code == 400, resp.text
        message = resp.json()["error"]["message"]
        assert value in message and "train or val" in message, message
    assert upstream.app.state.received == []  # nothing forwarded
    assert pub.flush(20) == 0
    assert consume(settings.kafka.bootstrap_servers, settings.topics.spans, 1,
                   timeout_s=3, settle_s=0.5) == []
