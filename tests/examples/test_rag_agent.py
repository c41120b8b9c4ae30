"""The rag agent through the real gateway onto the real broker: searches become tool spans,
whose outcomes (a hit, an empty result, a repeated query) the streams' AIR rules turn into
intermediate rewards. First against a scripted policy (fixed replies make each outcome
checkable: SmolLM2-135M does not choose them on demand), then against the real engine."""

from __future__ import annotations

import pytest
from test_calc_agent import _drain, scripted_policy

from demo.tasks import get_task
from examples.rag.agent import RagAgent
from examples.rag.corpus import world
from examples.rag.questions import Hop, Question, generate
from infra import processes
from producers.publisher import Publisher
from producers.tracer import Tracer
from streams.air_rules import AirRules
from testkit.fixed_upstream import ServerThread
from testkit.producers import running_gateway
from tracetrain.settings.streams import AirRuleSettings

pytestmark = pytest.mark.integration


def _company_question() -> Question:
    built = world()
    company = built.of_kind("company")[0]
    founder = built.value(company, "founder")
    return Question(f"Who founded {company.name}?", founder,
                    (Hop(company.id, "founder", founder),))


def _run(gateway_url, settings, tmp_path, question, agent_name="rag", **options):
    publisher = Publisher(settings, name="rag-agent", spool_dir=tmp_path / "agent-spool")
    try:
        agent = RagAgent(gateway_url + "/v1", tracer=Tracer(publisher, agent=agent_name), **options)
        episode = agent.solve(question, task_id="t-rag", seed=1)
        publisher.flush()
    finally:
        publisher.close()
    return episode


def test_searches_are_tool_spans_and_their_outcomes_become_air(kafka_settings, tmp_path):
    question = _company_question()
    company = question.question.removeprefix("Who founded ").removesuffix("?")
    replies = [f"<tool>search: {company} founder", f"<tool>search: founder {company}",
               "<tool>search: zeppelin quartz", f"ANSWER: {question.answer}"]
    seen: list[dict] = []
    policy = ServerThread(scripted_policy(replies, seen), processes.free_port()).start()
    try:
        with running_gateway(kafka_settings, policy.url + "/v1", tmp_path / "gw-spool", "gw-rag",
                             request_token_ids=False) as (url, settings, gateway_pub):
            episode = _run(url, settings, tmp_path, question)
            gateway_pub.flush()
    finally:
        policy.stop()

    assert (episode.tool_calls, episode.tool_errors) == (3, 2)
    assert episode.reward == pytest.approx(1.0) and episode.f1 == 1.0
    assert episode.retrieved[0] == question.supporting[0]
    # what went back to the policy: the documents, then the two refusals
    assert seen[1]["messages"][-1]["content"].startswith(f"Result: 1. {company} is a company")
    assert "was already searched" in seen[2]["messages"][-1]["content"]
    assert seen[3]["messages"][-1]["content"].startswith("Error: no document matches")

    spans = _drain(settings, settings.topics.spans, episode.rollout_id, 8, "Span")
    llm = [s for s in spans if s["kind"] == "llm"]
    tools = sorted((s for s in spans if s["kind"] == "tool"), key=lambda s: s["start_time_ns"])
    assert len(llm) == 4 and {s["agent_name"] for s in llm} == {"rag"}  # from the gateway
    assert [(t["tool"]["name"], t["tool"]["ok"]) for t in tools] == [
        ("search", True), ("search", False), ("search", False)]
    assert "RepeatedQuery" in tools[1]["error_message"]
    assert "EmptyResult" in tools[2]["error_message"]
    # the streams' AIR rules, as the worker applies them to these very spans
    rules = AirRules(AirRuleSettings())
    assert [[(e["rule"], e["value"]) for e in rules.derive(t)] for t in tools] == [
        [("tool_ok", 0.1)], [("tool_raised", -0.5)], [("tool_raised", -0.5)]]
    rewards = _drain(settings, settings.topics.rewards, episode.rollout_id, 1, "Reward")
    assert [(r["value"], r["final"], r["name"]) for r in rewards] == [
        (pytest.approx(1.0), True, "format_f1")]


def test_the_agent_runs_on_the_real_engine_through_the_gateway(engine_url, kafka_settings,
                                                               tmp_path):
    """The embedded engine's greedy answers drive the loop; every model call arrives as an LLM
    span with the policy's token ids, every search as a tool span, one rollout."""
    question = generate(1, 1, hops=(2,), split="heldout")[0]
    with running_gateway(kafka_settings, engine_url + "/v1", tmp_path / "gw-spool",
                         "gw-rag") as (url, settings, gateway_pub):
        episode = _run(url, settings, tmp_path, question, temperature=0.0)
        gateway_pub.flush()

    assert 0.0 <= episode.reward <= 1.0
    turns = sum(1 for m in episode.transcript[8:] if m["role"] == "assistant")  # after the demo
    # one LLM span a turn (the gateway), one tool span a search and the agent span (the tracer)
    spans = _drain(settings, settings.topics.spans, episode.rollout_id,
                   turns + episode.tool_calls + 1, "Span")
    llm = [s for s in spans if s["kind"] == "llm"]
    tools = [s for s in spans if s["kind"] == "tool"]
    assert len(llm) == turns and all(s["llm"]["response_token_ids"] for s in llm)
    assert len(tools) == episode.tool_calls and {t["tool"]["name"] for t in tools} <= {"search"}
    assert sum(not t["tool"]["ok"] for t in tools) == episode.tool_errors
    assert episode.tool_calls >= 1  # the demonstrated search format is copied
    assert [s["kind"] for s in spans].count("agent") == 1


def test_eval_scores_rag_by_answer_f1_and_traffic_by_reward():
    """`tracetrain eval` reports rag's answer F1 (the paper's figure); traffic is rewarded with
    format + F1 (demo/tasks.py)."""
    question = _company_question()
    first_name = question.answer.split()[0]  # half of a two-word name: F1 2/3
    seen: list[dict] = []
    policy = ServerThread(scripted_policy([f"ANSWER: {first_name}"], seen),
                          processes.free_port()).start()
    try:
        task = get_task("rag")
        agent = task.agent(policy.url + "/v1", tracer=None, temperature=0.0)
        assert task.metric == "f1"
        episode = task.run(agent, question, task_id="t-score", seed=1)
        assert task.score(episode) == pytest.approx(2 / 3)
        assert task.solve(agent, question, task_id="t-solve", seed=1) == pytest.approx(0.1 + 0.6)
    finally:
        policy.stop()
