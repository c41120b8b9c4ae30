"""The SQL team against a scripted policy server (fixed replies per agent, so the team's
control flow can be checked), with the real tracer and publisher on the real broker."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from test_calc_agent import _drain

from examples.sql.agents import SqlTeam, extract_sql
from examples.sql.databases import generate
from infra import processes
from producers.publisher import Publisher
from producers.tracer import Tracer
from testkit.fixed_upstream import ServerThread

pytestmark = pytest.mark.integration


def test_extract_sql():
    assert extract_sql("```sql\nSELECT 1;\n```") == "SELECT 1"
    assert extract_sql("Sure: SELECT name FROM t; -- done") == "SELECT name FROM t"
    assert extract_sql("no query here") == ""


def scripted_team(replies: dict[str, list[str]], calls: list[tuple[str, str]]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        agent = request.headers["x-agent-name"]
        calls.append((agent, request.headers["x-rollout-id"]))
        n = sum(1 for a, _ in calls if a == agent)
        text = replies[agent][min(n, len(replies[agent])) - 1]
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}]}

    return app


def test_writer_error_then_rewriter_fixes_it(kafka_settings, tmp_path):
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
        team = SqlTeam(f"http://127.0.0.1:{port}/v1", tracer=Tracer(publisher))
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
