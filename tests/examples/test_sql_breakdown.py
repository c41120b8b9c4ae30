"""Each SQL agent's figures from episodes (`tracetrain eval --task sql --per-agent`), on real
generated SQLite databases, counted by hand."""

from __future__ import annotations

from examples.sql.agents import SqlEpisode
from examples.sql.breakdown import breakdown, failure_kind
from examples.sql.databases import generate


def _episode(task, queries, verdicts, final_right: bool) -> SqlEpisode:
    return SqlEpisode(task, "ro", queries=queries, verdicts=verdicts,
                      reward=1.0 if final_right else 0.0)


def test_failures_are_named_by_what_went_wrong(tmp_path):
    task = generate(1, seed=5, folder=tmp_path)[0]
    kind = lambda sql: failure_kind(task.db, sql, task.gold_sql)  # noqa: E731
    assert kind(task.gold_sql) == "right"
    assert kind("SELECT 12345") == "wrong result"
    assert kind("SELECT * FROM nowhere") == "no such table"
    assert kind("") == "empty query"
    assert kind("SELEC 1") == "syntax error"
    assert kind("CREATE TABLE t (a)") == "not a read-only select"


def test_breakdown_counts_each_agent(tmp_path):
    a, b, c = generate(3, seed=6, folder=tmp_path)
    episodes = [
        # Writer right, Checker accepts: one round
        _episode(a, [a.gold_sql], ["CORRECT"], True),
        # Writer's table does not exist; Checker rejects; Rewriter repairs; Checker accepts
        _episode(b, ["SELECT * FROM nowhere", b.gold_sql], ["WRONG", "CORRECT"], True),
        # Writer right, but the Checker rejects it and the Rewriter breaks it
        _episode(c, [c.gold_sql, "SELECT 12345"], ["WRONG", "WRONG"], False),
    ]
    figures = breakdown(episodes)
    assert figures["n"] == 3 and figures["team_accuracy"] == round(2 / 3, 4)
    assert figures["writer_first_query"] == {"right": round(2 / 3, 4),
                                             "no such table": round(1 / 3, 4)}
    # checked: a gold (accepted, right), b nowhere (rejected, wrong), b gold (accepted, right),
    # c gold (rejected, right), c 12345 (rejected, wrong): 4 of 5 agree
    assert figures["checker_agrees"] == 0.8
    assert figures["checker_accepts_wrong"] == 0.0
    assert (figures["rewriter_repaired"], figures["rewriter_broke"]) == (1, 1)


def test_a_checker_accepting_an_error_does_not_end_the_round(tmp_path):
    """The team never accepts a query that failed to run, whatever the Checker says: such a
    verdict counts as a rejection."""
    (task,) = generate(1, seed=7, folder=tmp_path)
    figures = breakdown([_episode(task, ["SELECT * FROM nowhere"], ["CORRECT"], False)])
    assert figures["checker_agrees"] == 1.0 and figures["checker_accepts_wrong"] == 0.0
