"""The SQL team, plain code and on LangGraph, against a scripted policy server (fixed replies
per agent, so the team's control flow can be checked), with the real tracer and publisher on
the real broker; and the LangGraph team on the real engine."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from test_calc_agent import _drain

from examples.sql.agents import SqlTeam, extract_sql
from examples.sql.databases import generate
from examples.sql.langgraph_team import LangGraphSqlTeam
from infra import processes
from producers.publisher import Publisher
from producers.tracer import Tracer
from testkit.fixed_upstream import ServerThread

pytestmark = pytest.mark.integration


def test_extract_sql():
    assert extract_sql("```sql\nSELECT 1;\n```") == "SELECT 1"
    assert extract_sql("Sure: SELECT name FROM t; -- done") == "SELECT name FROM t"
    assert extract_sql("no query here") == ""


def scripted_team(replies: dict[str, list[str]], calls: list[tuple[str, str]],
                  bodies: list[dict] | None = None) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        agent = request.headers["x-agent-name"]
        calls.append((agent, request.headers.get("x-rollout-id")))
        if bodies is not None:
            bodies.append(body)
        n = sum(1 for a, _ in calls if a == agent)
        text = replies[agent][min(n, len(replies[agent])) - 1]
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}]}

    return app


TEAMS = pytest.mark.parametrize("team_class", [SqlTeam, LangGraphSqlTeam])


@TEAMS
def test_writer_error_then_rewriter_fixes_it(kafka_settings, tmp_path, team_class):
    task = generate(1, seed=1, folder=tmp_path / "dbs")[0]
    calls: list[tuple[str, str]] = []
    replies = {
        "writer": ["SELECT COUNT(*) FROM customer"],  # wrong table: an SQL error
        "checker": ["WRONG: the table is customers", "CORRECT"],
        "rewriter": [f"```sql\n{task.gold_sql}\n```"],
    }
    port = processes.free_port()
    server = ServerThread(scripted_team(replies, calls), port).start()
    publisher = Publisher(kafka_settings, name="sql-test", spool_dir=tmp_path / "spool")
    try:
        team = team_class(f"http://127.0.0.1:{port}/v1", tracer=Tracer(publisher))
        episode = team.solve(task)
        publisher.flush()
    finally:
        publisher.close()
        server.stop()
    assert [a for a, _ in calls] == ["writer", "checker", "rewriter", "checker"]
    assert {r for _, r in calls} == {episode.rollout_id}
    assert episode.queries == ["SELECT COUNT(*) FROM customer", task.gold_sql]
    assert episode.reward == 1.0
    spans = _drain(kafka_settings, kafka_settings.topics.spans, episode.rollout_id, 3, "Span")
    tools = sorted((s for s in spans if s["kind"] == "tool"), key=lambda s: s["start_time_ns"])
    assert [t["tool"]["ok"] for t in tools] == [False, True]
    assert "no such table: customer" in (tools[0]["error_message"] or tools[0]["tool"]["result"] or "")
    rewards = _drain(kafka_settings, kafka_settings.topics.rewards, episode.rollout_id, 1, "Reward")
    assert [(r["value"], r["final"]) for r in rewards] == [(1.0, True)]


@TEAMS
def test_the_team_stops_after_its_last_round(tmp_path, team_class):
    """The Checker never accepts: two rounds are run and checked, the last rewrite is what is
    scored (it is never run), and every call is one agent's."""
    task = generate(1, seed=2, folder=tmp_path / "dbs")[0]
    calls: list[tuple[str, str]] = []
    replies = {"writer": ["SELECT 1"], "checker": ["WRONG"],
               "rewriter": ["SELECT 2", task.gold_sql]}
    port = processes.free_port()
    server = ServerThread(scripted_team(replies, calls), port).start()
    try:
        episode = team_class(f"http://127.0.0.1:{port}/v1", max_rounds=2).solve(task)
    finally:
        server.stop()
    assert [a for a, _ in calls] == ["writer", "checker", "rewriter", "checker", "rewriter"]
    assert episode.queries == ["SELECT 1", "SELECT 2"] and episode.verdicts == ["WRONG"] * 2
    assert episode.reward == 1.0  # the last rewrite, gold, is the team's answer


def test_langgraph_team_runs_on_the_real_engine(engine_url, tmp_path):
    """langchain-openai's requests are accepted by the embedded engine, greedily and
    repeatably; whatever SmolLM2 writes is run and scored."""
    task = generate(1, seed=3, folder=tmp_path / "dbs")[0]
    team = LangGraphSqlTeam(engine_url + "/v1", temperature=0.0, max_tokens=48)
    first, again = team.solve(task, task_id="lg-1"), team.solve(task, task_id="lg-1")
    assert 1 <= len(first.queries) <= 2 and len(first.verdicts) == len(first.queries)
    assert first.reward in (0.0, 1.0)
    assert (again.queries, again.verdicts) == (first.queries, first.verdicts)


def test_both_teams_send_the_same_requests(tmp_path):
    """Why the plain-code team stays the default: the LangGraph team's calls carry the same
    messages and sampling settings, so the learner sees the same traffic from either."""
    task = generate(1, seed=4, folder=tmp_path / "dbs")[0]
    replies = {"writer": ["SELECT 1"], "checker": ["WRONG"], "rewriter": ["SELECT 2"]}
    sent = {}
    for team_class in (SqlTeam, LangGraphSqlTeam):
        bodies: list[dict] = []
        port = processes.free_port()
        server = ServerThread(scripted_team(replies, [], bodies), port).start()
        try:
            team_class(f"http://127.0.0.1:{port}/v1", temperature=0.7).solve(task, "same")
        finally:
            server.stop()
        # langchain-openai names the limit max_completion_tokens (the engine and vLLM read both)
        sent[team_class] = [(b["messages"], b["temperature"], b["model"],
                             b.get("max_tokens", b.get("max_completion_tokens"))) for b in bodies]
    assert len(sent[SqlTeam]) == 5 and sent[LangGraphSqlTeam] == sent[SqlTeam]
