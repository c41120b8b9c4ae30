"""OpenTelemetry traffic becomes training data, end to end: an `openai` client instrumented by
opentelemetry-instrumentation-openai (GenAI conventions, messages captured) calls the engine
double directly; its spans reach tracetrain ONLY through OTLP/HTTP to the real gateway's
/v1/traces (the gateway's own upstream is a dead address: no call goes through it), rewards
through the gateway's reward API; the real streams worker process re-tokenises the calls with
the policy's tokenizer into transitions marked re-tokenised, with the ids the engine gives the
same conversations; the learner trains a step on them and moves the rewarded answers up.

Real broker, worker process, MLflow and learner; the tiny model (the SmolLM2 tokenizer). The
fixed upstream stands in for the engine: only the spans' content matters here."""

from __future__ import annotations

import json
import math

import openai
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from pydantic import SecretStr

from infra import processes, services
from learner.loop import run_learner
from learner.trainer import PolicyTrainer
from schemas import Codec
from serving.engine.prompts import chat_prompt_ids
from streams.service import STREAMS
from testkit.fixed_upstream import ServerThread
from testkit.fixed_upstream import app as fixed_upstream
from testkit.learner import learner_settings
from testkit.streams import consume

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                    "b": {"type": "number"}}}}}]
QUESTION = {"role": "user", "content": "What is 2 + 3? Use the tool."}
# (tool result the agent hands back, final reward): two right answers, two wrong ones
ROLLOUTS = [("5", 1.0), ("6", 0.0), ("5", 1.0), ("6", 0.0)]


@pytest.fixture
def stack(kafka_settings, mlflow_server, tiny_model_dir, tmp_path):
    """Settings on this test's topics (base model: the tiny one), the engine double, a gateway
    whose upstream nobody listens on, and the real worker process."""
    from producers.gateway.app import create_app
    from producers.publisher import Publisher

    upstream = ServerThread(fixed_upstream(), processes.free_port()).start()
    base = kafka_settings.model_copy(update={
        "mlflow": mlflow_server,
        "gateway": kafka_settings.gateway.model_copy(update={
            "upstream_url": f"http://127.0.0.1:{processes.free_port()}/v1",
            "api_keys": [SecretStr("k")]}),
        "streams": kafka_settings.streams.model_copy(update={
            "idle_timeout_s": 30.0, "close_grace_s": 1.0, "web_port": processes.free_port()})})
    settings = learner_settings(base, tiny_model_dir, mode="rl", batch_size=8, lr=5e-3,
                                advantage="batch", checkpoint_every_steps=1)
    pub = Publisher(settings, name="gw-otlp", spool_dir=tmp_path / "spool")
    gateway = ServerThread(create_app(settings, publisher=pub), processes.free_port()).start()
    worker = services.start(settings, STREAMS, instance="streams-otlp-traffic",
                            extra_argv=["--max-seconds", "400"])
    yield settings, upstream, gateway
    processes.stop(settings.home_dir, worker.name, timeout_s=10)
    gateway.stop()
    pub.close(10)
    upstream.stop()


def _agent(gateway_url: str, upstream_url: str) -> list[tuple[str, list[dict]]]:
    """Run the instrumented agent: per rollout (one trace), a call that asks for the tool and
    one that answers from its result. Returns (rollout id, the answering call's messages)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
        endpoint=gateway_url + "/v1/traces", headers={"Authorization": "Bearer k"})))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    tracer, done = provider.get_tracer("agent"), []
    try:
        client = openai.OpenAI(base_url=upstream_url + "/v1", api_key="x", max_retries=0)
        for result, _ in ROLLOUTS:
            with tracer.start_as_current_span("solve") as root:
                asked = client.chat.completions.create(
                    model="fixed-model", messages=[QUESTION], tools=TOOLS, temperature=0.7)
                call = asked.choices[0].message.tool_calls[0]
                messages = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [{
                    "id": call.id, "type": "function", "function": {
                        "name": call.function.name, "arguments": call.function.arguments}}]},
                    {"role": "tool", "tool_call_id": call.id, "content": result}]
                client.chat.completions.create(model="fixed-model", messages=messages,
                                               tools=TOOLS, temperature=0.7)
            done.append((f"otel-{root.get_span_context().trace_id:032x}", messages))
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    return done


def test_instrumented_openai_traffic_sent_only_by_otlp_trains_the_policy(stack, tiny_model_dir,
                                                                         tmp_path):
    import httpx
    from transformers import AutoTokenizer

    settings, upstream, gateway = stack
    rollouts = _agent(gateway.url, upstream.url)
    assert len(upstream.app.state.received) == 8  # the calls went straight to the engine
    for (rollout_id, _), (_, reward) in zip(rollouts, ROLLOUTS, strict=True):
        resp = httpx.post(gateway.url + "/v1/rewards", headers={"Authorization": "Bearer k"},
                          json={"rollout_id": rollout_id, "value": reward, "final": True})
        assert resp.status_code == 202, resp.text

    codec = Codec()
    records = consume(settings, "transitions", lambda r: len(r) >= 8, timeout_s=120)
    transitions = {}
    for _, value, _ in records:
        t = codec.decode(value, "Transition")
        transitions[(t["rollout_id"], t["turn_index"])] = t
    assert len(transitions) == 8, sorted(transitions)
    hf = AutoTokenizer.from_pretrained(tiny_model_dir)
    for (rollout_id, answered), (tool_result, reward) in zip(rollouts, ROLLOUTS, strict=True):
        asking, answering = transitions[(rollout_id, 0)], transitions[(rollout_id, 1)]
        for t in (asking, answering):
            assert t["retokenized"] and t["behaviour_logprobs"] == []
            assert t["sampling_temperature"] == 0.7 and t["final_reward"] == reward
        # the ids the engine would have given these conversations
        assert asking["prompt_token_ids"] == chat_prompt_ids(hf, [QUESTION], TOOLS)
        assert answering["prompt_token_ids"] == chat_prompt_ids(hf, answered, TOOLS)
        assert hf.decode(answering["response_token_ids"]) == \
            f"The answer is {tool_result}.<|im_end|>"
        call = hf.decode(asking["response_token_ids"], skip_special_tokens=True)
        assert json.loads(call.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")) \
            == {"name": "add", "arguments": {"a": 2, "b": 3}}
    dead = consume(settings, "dlq", lambda r: False, timeout_s=2.0)
    assert dead == [], [h for _, _, h in dead]

    before = PolicyTrainer(settings, tmp_path / "before")
    answers = [transitions[(rollout_id, 1)] for rollout_id, _ in rollouts]
    start = before.response_logprob_sums(answers)
    result = run_learner(settings, experiment="otlp-traffic", model_name="otlp-traffic",
                         max_steps=1, max_seconds=240)
    assert result.steps == 1 and len(result.ledger[0]) == 8
    assert result.metrics["retokenized"] == 8 and result.metrics["behaviour_token_fraction"] == 0
    assert result.metrics["clip_fraction"] == 0 and math.isfinite(result.metrics["loss"])
    assert result.counters["accepted_retokenized"] == 8
    moved = [a - b for a, b in zip(result.policy.response_logprob_sums(answers), start,
                                   strict=True)]
    right = [m for m, (_, reward) in zip(moved, ROLLOUTS, strict=True) if reward]
    wrong = [m for m, (_, reward) in zip(moved, ROLLOUTS, strict=True) if not reward]
    assert min(right) > max(wrong), moved
