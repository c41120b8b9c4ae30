"""Unmodified agent frameworks re-pointed at the gateway by their base URL alone: a LangChain
agent (`create_agent` with a tool, in this process) and a CrewAI crew (two agents, two tasks, in
its own environment and process: crewai cannot share tracetrain's). Each runs on the real
engine through the real gateway, with the rollout id in the base URL's path; the real streams
worker turns what arrives into transitions once the reward API closes the rollout.

SmolLM2-135M decides how many calls a framework makes (a tool call or not, a parse retry or
not), so nothing here depends on its answers: every model call the framework itself counted is
one LLM span of the one rollout, with the policy's token ids, and becomes one transition. The
LangChain tool loop is also run against the engine double (testkit.fixed_upstream), whose fixed
tool call makes the loop's two calls checkable."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from examples.frameworks import langchain_agent
from infra import processes
from testkit.fixed_upstream import ServerThread
from testkit.fixed_upstream import app as fixed_upstream
from testkit.producers import consume, running_gateway

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CREWAI_PYTHON = REPO / ".venv-crewai" / "bin" / "python"
CREW = REPO / "examples" / "frameworks" / "crewai_crew.py"


def _close_and_collect(url: str, settings, publisher, rollout_id: str,
                       llm_calls: int) -> tuple[list[dict], list[dict]]:
    """Close the rollout with a final reward (as the service's judge would), then read back
    every span and transition of this test's topics."""
    resp = httpx.post(url + "/v1/rewards", timeout=30,
                      json={"rollout_id": rollout_id, "value": 1.0, "final": True})
    assert resp.status_code == 202, resp.text
    assert publisher.flush(20) == 0
    bootstrap = settings.kafka.bootstrap_servers
    spans = [s for _, s in consume(bootstrap, settings.topics.spans, llm_calls, timeout_s=60,
                                   name="Span", settle_s=1.0)]
    transitions = [t for _, t in consume(bootstrap, settings.topics.transitions, llm_calls,
                                         timeout_s=120, name="Transition", settle_s=3.0)]
    return spans, transitions


def _check_one_rollout(spans: list[dict], transitions: list[dict], rollout_id: str,
                       llm_calls: int) -> None:
    assert llm_calls >= 1
    assert len(spans) == llm_calls, [s["llm"]["response_text"] for s in spans]
    assert {s["rollout_id"] for s in spans} == {rollout_id}
    assert {s["kind"] for s in spans} == {"llm"}
    assert all(s["llm"]["prompt_token_ids"] and s["llm"]["response_token_ids"] for s in spans)
    # one transition per call, of the same rollout, carrying that call's tokens and the reward
    assert len(transitions) == llm_calls
    assert {t["rollout_id"] for t in transitions} == {rollout_id}
    by_span = {s["span_id"]: s for s in spans}
    assert sorted(t["span_id"] for t in transitions) == sorted(by_span)
    for t in transitions:
        span = by_span[t["span_id"]]
        assert t["response_token_ids"] == span["llm"]["response_token_ids"]
        assert t["prompt_token_ids"] == span["llm"]["prompt_token_ids"]
        assert t["final_reward"] == 1.0
    assert sorted(t["turn_index"] for t in transitions) == list(range(llm_calls))
    assert [t["is_last"] for t in sorted(transitions, key=lambda t: t["turn_index"])] == \
        [False] * (llm_calls - 1) + [True]


def _run_langchain(upstream_url: str, streams_settings, workers, tmp_path, rollout_id: str):
    """The LangChain agent through a gateway in front of `upstream_url`, on a real worker:
    (the agent's result, spans, transitions)."""
    workers(streams_settings)
    with running_gateway(streams_settings, upstream_url, tmp_path / "spool",
                         "gw-langchain") as (url, settings, pub):
        result = langchain_agent.run(f"{url}/rollouts/{rollout_id}/v1", max_tokens=48)
        spans, transitions = _close_and_collect(url, settings, pub, rollout_id,
                                                result["llm_calls"])
    _check_one_rollout(spans, transitions, rollout_id, result["llm_calls"])
    # the requests are LangChain's own: the tool offered, the question asked
    first = min(spans, key=lambda s: s["start_time_ns"])
    assert "add" in first["attributes"]["tools"]
    assert json.loads(first["llm"]["request_messages"])[-1]["content"] == langchain_agent.QUESTION
    return result, spans


def test_langchain_tool_loop_is_one_rollout_of_transitions(streams_settings, workers, tmp_path):
    """The whole loop (a tool call, the tool's result sent back, the answer), checkable because
    the engine double always calls the first tool offered with a=2, b=3."""
    upstream = ServerThread(fixed_upstream(), processes.free_port()).start()
    try:
        result, spans = _run_langchain(upstream.url + "/v1", streams_settings, workers,
                                       tmp_path, "ro-langchain-tool")
    finally:
        upstream.stop()
    assert (result["llm_calls"], result["tool_calls"]) == (2, 1)
    assert result["answer"] == "The answer is 5."
    asked, answered = sorted(spans, key=lambda s: s["start_time_ns"])
    assert asked["llm"]["finish_reason"] == "tool_calls"
    assert json.loads(asked["attributes"]["tool_calls"])[0]["function"]["name"] == "add"
    sent_back = json.loads(answered["llm"]["request_messages"])
    assert [m["content"] for m in sent_back if m["role"] == "tool"] == ["5"]  # the tool ran


def test_langchain_agent_on_the_real_engine_is_one_rollout_of_transitions(
        engine_url, streams_settings, workers, tmp_path):
    """SmolLM2 may or may not call the tool: whichever, each call is a span and a transition."""
    result, spans = _run_langchain(engine_url + "/v1", streams_settings, workers, tmp_path,
                                   "ro-langchain-1")
    # a call after the first only follows a tool run, and sends its result back
    first = min(spans, key=lambda s: s["start_time_ns"])
    later = [json.loads(s["llm"]["request_messages"]) for s in spans if s is not first]
    assert bool(later) == (result["tool_calls"] > 0)
    assert all(any(m["role"] == "tool" for m in sent) for sent in later)


def test_crewai_crew_in_its_own_process_is_one_rollout_of_transitions(
        engine_url, streams_settings, workers, tmp_path):
    if not CREWAI_PYTHON.exists():
        pytest.fail(f"{CREWAI_PYTHON} is missing: `make crewai-venv` builds the crew's "
                    "environment (`make setup` and `make test` do it too)")
    workers(streams_settings)
    with running_gateway(streams_settings, engine_url + "/v1", tmp_path / "spool",
                         "gw-crewai") as (url, settings, pub):
        # the crew's process sees only its own environment: no tracetrain settings, no proxy
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
               "CREWAI_STORAGE_DIR": str(tmp_path / "crewai")}
        run = subprocess.run(
            [str(CREWAI_PYTHON), str(CREW), "--base-url", url + "/rollouts/ro-crew-1/v1",
             "--max-tokens", "48"], env=env, cwd=tmp_path, capture_output=True, text=True,
            timeout=300)
        assert run.returncode == 0, run.stderr[-4000:]
        report = json.loads(run.stdout.strip().splitlines()[-1])
        spans, transitions = _close_and_collect(url, settings, pub, "ro-crew-1",
                                                report["llm_calls"])
    assert report["failed_calls"] == 0 and len(report["tasks"]) == 2
    assert report["llm_calls"] >= 2  # one agent per task, each asked at least once
    _check_one_rollout(spans, transitions, "ro-crew-1", report["llm_calls"])
    # the requests are the crew's own: each agent's role in its system prompt
    systems = [json.loads(s["llm"]["request_messages"])[0] for s in spans]
    assert {m["role"] for m in systems} == {"system"}
    roles = {role for m in systems for role in ("Solver", "Checker") if role in m["content"]}
    assert roles == {"Solver", "Checker"}
