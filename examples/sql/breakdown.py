"""What bounds the SQL team's learning: each agent's success on a set of episodes.

    figures = breakdown(episodes)     # `tracetrain eval --task sql --per-agent` prints these

Learning from traffic needs traces that succeed: `sft` trains on rewarded rollouts only and
`rl`'s group advantages are zero where every rollout of a task failed. So the figures are the
Writer's first query (how often it is right, and how it fails), the Checker's verdicts against
the truth (a frozen Checker that accepts wrong queries ends rounds the Rewriter could have
used), and the Rewriter's repairs.
"""

from __future__ import annotations

import re
from collections import Counter

from examples.sql.agents import SqlEpisode, accepted
from examples.sql.execution import execute, reward

# How a query fails, from the executor's message: the Writer's typical mistakes first.
_FAILURES = (
    ("empty query", re.compile(r"^empty query")),
    ("no such table", re.compile(r"no such table")),
    ("no such column", re.compile(r"no such column")),
    ("syntax error", re.compile(r"syntax error|incomplete input|unrecognized token")),
    ("not a read-only select", re.compile(r"is not allowed")),
)


def failure_kind(db: str, sql: str, gold_sql: str) -> str:
    """'right', 'wrong result', or how the query failed to run."""
    result = execute(db, sql)
    if result.error is None:
        return "right" if reward(db, sql, gold_sql) == 1.0 else "wrong result"
    for kind, pattern in _FAILURES:
        if pattern.search(result.error):
            return kind
    return "other error"


def breakdown(episodes: list[SqlEpisode]) -> dict:
    n = len(episodes)
    writer = Counter()
    checker = Counter()  # (verdict, truth) of every checked query
    repaired = broken = 0
    for episode in episodes:
        task = episode.task
        kinds = [failure_kind(task.db, sql, task.gold_sql) for sql in episode.queries]
        writer[kinds[0] if kinds else "empty query"] += 1
        for sql, kind, verdict in zip(episode.queries, kinds, episode.verdicts, strict=True):
            shown = "error:" if execute(task.db, sql).error else "rows:"
            said = "accepted" if accepted(verdict, shown) else "rejected"
            checker[(said, "right" if kind == "right" else "wrong")] += 1
        first_right = bool(kinds) and kinds[0] == "right"
        repaired += int(not first_right and episode.reward == 1.0)
        broken += int(first_right and episode.reward == 0.0)
    checked = sum(checker.values())
    wrong_checked = checker[("accepted", "wrong")] + checker[("rejected", "wrong")]
    return {
        "n": n,
        "team_accuracy": round(sum(e.reward for e in episodes) / max(1, n), 4),
        "writer_first_query": {k: round(v / max(1, n), 4) for k, v in writer.most_common()},
        # the Checker's verdicts against the truth of the query it judged
        "checker_agrees": round((checker[("accepted", "right")] + checker[("rejected", "wrong")])
                                / max(1, checked), 4),
        "checker_accepts_wrong": round(checker[("accepted", "wrong")] / max(1, wrong_checked), 4),
        "rewriter_repaired": repaired,  # episodes whose first query was wrong and final right
        "rewriter_broke": broken,  # first query right, final wrong
    }
