"""The real embedded engine (our API over llama-server) with the real default model, through the
official openai client; logprobs are checked against the learner's own forward pass."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from testkit.metrics import check_metrics, get_state
from testkit.serving import policy_info, token_logprobs

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# llama.cpp's f32 kernels against torch's on the same f32 weights: measured mean 0.0015, max
# 0.012 per token over 155 sampled tokens (bench.logprobs); a wrong model or template is > 0.1.
GAP_MAX, GAP_MEAN = 0.03, 0.006


def assert_close(served: list[float], recomputed: list[float]) -> None:
    gaps = [abs(a - b) for a, b in zip(served, recomputed, strict=True)]
    assert max(gaps) < GAP_MAX and sum(gaps) / len(gaps) < GAP_MEAN, gaps


@pytest.fixture(scope="module")
def client(engine_url):
    return openai.OpenAI(base_url=f"{engine_url}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def forward_logprobs(reference, prompt_ids, token_ids, temperature: float = 1.0):
    return token_logprobs(reference[0], prompt_ids, token_ids, temperature)


def test_chat_returns_text_token_ids_and_logprobs_of_a_forward_pass(client, reference):
    raw = client.chat.completions.with_raw_response.create(
        model="policy", messages=QUESTION, max_tokens=6, temperature=0, logprobs=True)
    reply = raw.parse()
    choice = reply.choices[0]
    extra = reply.model_extra
    _, tokenizer = reference
    expected_prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True,
                                                    return_dict=True)["input_ids"]
    assert extra["prompt_token_ids"] == list(expected_prompt)
    token_ids = choice.model_extra["token_ids"]
    assert len(token_ids) == 6 and choice.finish_reason == "length"
    assert choice.message.content == tokenizer.decode(token_ids, skip_special_tokens=True)
    assert "capital" in choice.message.content
    served = [entry.logprob for entry in choice.logprobs.content]
    assert [entry.token for entry in choice.logprobs.content] == [
        tokenizer.decode([t]) for t in token_ids]
    recomputed = forward_logprobs(reference, extra["prompt_token_ids"], token_ids)
    assert_close(served, recomputed)
    assert reply.usage.prompt_tokens == len(expected_prompt)
    assert reply.usage.completion_tokens == 6
    assert extra["policy_version"] == 0 and raw.headers["x-policy-version"] == "0"


def test_concurrent_requests_run_together_and_match_solo_greedy(client, engine_url):
    prompts = [[{"role": "user", "content": text}] for text in
               ("Hi", "Name a colour.", "What is two plus two? Answer briefly.", "Say yes.")]
    ask = lambda messages: client.chat.completions.create(  # noqa: E731
        model="policy", messages=messages, max_tokens=24, temperature=0)
    solo = [ask(m).choices[0].model_extra["token_ids"] for m in prompts[:2]]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, prompts))
    info = policy_info(engine_url)
    # Sharing decode steps with other sequences must not change what one generates.
    assert [r.choices[0].model_extra["token_ids"] for r in together[:2]] == solo
    assert info["most_in_flight"] >= 2 and info["slots"] >= len(prompts)


def test_sampling_honours_seed_temperature_and_stop(client, reference):
    ask = lambda **kw: client.chat.completions.create(  # noqa: E731
        model="policy", messages=QUESTION, max_tokens=5, **kw)
    first, again = ask(temperature=1.2, seed=7), ask(temperature=1.2, seed=7)
    assert first.choices[0].model_extra["token_ids"] == again.choices[0].model_extra["token_ids"]
    # Sampled tokens carry the logprobs of the distribution they were sampled from: the
    # model's at the request's temperature, what the learner scores them at.
    recomputed = forward_logprobs(reference, first.model_extra["prompt_token_ids"],
                                  first.choices[0].model_extra["token_ids"], temperature=1.2)
    assert_close([e.logprob for e in first.choices[0].logprobs.content], recomputed)
    stopped = client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=8,
                                             temperature=0, stop=[" of"])
    assert stopped.choices[0].message.content == "The capital"
    assert stopped.choices[0].finish_reason == "stop"


def test_over_context_request_is_a_400_that_says_so(client, engine_url):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=100_000)
    assert "maximum context length is 2048" in str(info.value)
    # the refusal is counted, under the scheme, and the typed state says so too
    names = check_metrics(engine_url, "engine")
    assert {"tracetrain_engine_handled_calls_total", "tracetrain_engine_generated_tokens_total",
            "tracetrain_engine_policy_version"} <= names
    text = httpx.get(f"{engine_url}/metrics").text
    assert 'tracetrain_engine_handled_calls_total{route="chat",status="4xx"}' in text
    state = get_state(engine_url)
    assert state["handled_calls"]["chat"] >= 1 and state["policy_version"] >= 0
    assert state["generated_tokens"] >= 0 and isinstance(state["checkpoint_loads"], dict)


def test_completions_and_models(client):
    reply = client.completions.create(model="policy", prompt="The capital of France is",
                                      max_tokens=3, temperature=0, logprobs=1)
    choice = reply.choices[0]
    assert len(choice.model_extra["token_ids"]) == 3
    assert len(choice.logprobs.token_logprobs) == 3
    assert "Paris" in choice.text
    assert "policy" in {m.id for m in client.models.list().data}


def test_ignore_eos_and_tokens_inside_a_multibyte_character_keep_their_logprobs(
        client, engine_url, reference):
    hello = [{"role": "user", "content": "Say hello."}]
    short = client.chat.completions.create(model="policy", messages=hello, max_tokens=120,
                                           temperature=0)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 120
    # Past its end of turn the greedy answer goes on with emojis (three byte-level tokens
    # each): llama-server unpatched gave no logprob (nor, streaming, token id) to the first two.
    full = client.chat.completions.create(model="policy", messages=hello, max_tokens=60,
                                          temperature=0, logprobs=True,
                                          extra_body={"ignore_eos": True})
    choice = full.choices[0]
    token_ids = choice.model_extra["token_ids"]
    assert choice.finish_reason == "length" and full.usage.completion_tokens == 60
    _, tokenizer = reference
    assert any("\ufffd" in tokenizer.decode([t]) for t in token_ids), "no partial character"
    served = [entry.logprob for entry in choice.logprobs.content]
    assert_close(served, forward_logprobs(reference, full.model_extra["prompt_token_ids"],
                                          token_ids))
    streamed = []
    with httpx.stream("POST", f"{engine_url}/v1/chat/completions", timeout=120, json={
            "model": "policy", "messages": hello, "max_tokens": 60, "temperature": 0,
            "ignore_eos": True, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                streamed += json.loads(line[6:])["choices"][0]["token_ids"]
    assert streamed == token_ids
    with pytest.raises(openai.BadRequestError, match="ignore_eos='yes'"):
        client.chat.completions.create(model="policy", messages=hello, max_tokens=5,
                                       extra_body={"ignore_eos": "yes"})


def test_n_choices_are_distinct_samples_each_with_its_own_logprobs(engine_url, reference):
    body = {"model": "policy", "messages": QUESTION, "max_tokens": 10, "temperature": 1.0,
            "seed": 11, "n": 3}
    with httpx.Client(base_url=engine_url, timeout=120) as http:
        many = http.post("/v1/chat/completions", json=body).json()
        streamed: dict[int, list[int]] = {}
        streamed_logprobs: dict[int, list[float]] = {}
        with http.stream("POST", "/v1/chat/completions",
                         json={**body, "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        streamed.setdefault(choice["index"], []).extend(choice["token_ids"])
                        streamed_logprobs.setdefault(choice["index"], []).extend(
                            e["logprob"] for e in (choice["logprobs"] or {}).get("content", []))
    choices = many["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    # Seeds seed, seed + 1, ...: the choices differ. (Not token for token the single calls with
    # those seeds: sharing decode steps moves sampled logits by float noise, enough to flip a
    # sampled token; greedy answers do match, test_concurrent_requests_...)
    assert len({tuple(c["token_ids"]) for c in choices}) == 3
    for choice in choices:  # each a sample of the model at temperature 1, its own logprobs
        served = [entry["logprob"] for entry in choice["logprobs"]["content"]]
        assert_close(served, forward_logprobs(reference, many["prompt_token_ids"],
                                              choice["token_ids"]))
    assert many["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)
    assert many["usage"]["prompt_tokens"] == len(many["prompt_token_ids"])
    assert sorted(streamed) == [0, 1, 2] and len(set(map(tuple, streamed.values()))) == 3
    for index, ids in streamed.items():  # streamed tokens carry their logprobs too
        assert 0 < len(ids) <= 10
        assert_close(streamed_logprobs[index],
                     forward_logprobs(reference, many["prompt_token_ids"], ids))


# Each field llama-server would refuse (a 502 naming its own error), choke on (a 500) or obey
# at any cost (10**6 alternatives per token): a 400 from the engine naming the field and value.
BAD_FIELDS = [
    ({"prompt": [1, 10**6]}, "prompt[1]=1000000"),
    ({"prompt": [-5, 1]}, "prompt[0]=-5"),
    ({"logprobs": 10**6}, "logprobs=1000000"),
    ({"top_logprobs": 21}, "top_logprobs=21"),
    ({"temperature": float("nan")}, "temperature=nan"),
    ({"temperature": "hot"}, "temperature='hot'"),
    ({"top_p": float("inf")}, "top_p=inf"),
    ({"top_p": 1.5}, "top_p=1.5"),
    ({"seed": "x"}, "seed='x'"),
    ({"stop": [1]}, "stop=[1]"),
    ({"max_tokens": "10"}, "max_tokens='10'"),
    ({"n": 0}, "n=0"),
    ({"n": 10**6}, "n=1000000"),
]


def test_invalid_fields_are_400s_naming_them_and_other_requests_are_served(engine_url):
    def post(fields: dict) -> httpx.Response:
        body = {"model": "policy", "prompt": "The capital of France is", "max_tokens": 3,
                "temperature": 0, **fields}
        # json.dumps, not httpx's encoder: it writes NaN and Infinity as a careless client does
        return httpx.post(f"{engine_url}/v1/completions", content=json.dumps(body),
                          headers={"content-type": "application/json"}, timeout=120)

    with ThreadPoolExecutor(4) as pool:
        good = [pool.submit(post, {}) for _ in range(3)]
        bad = [(pool.submit(post, fields), named) for fields, named in BAD_FIELDS]
        good = [future.result() for future in good]
        bad = [(future.result(), named) for future, named in bad]
    assert [r.status_code for r in good] == [200] * 3
    assert all("Paris" in r.json()["choices"][0]["text"] for r in good)
    for response, named in bad:
        assert response.status_code == 400, (named, response.status_code, response.text)
        assert named in response.json()["error"]["message"], response.text
    for content in (b"{not json", b"[1, 2]"):
        response = httpx.post(f"{engine_url}/v1/chat/completions", content=content,
                              headers={"content-type": "application/json"}, timeout=30)
        assert response.status_code == 400 and "body" in response.json()["error"]["message"]
