"""Running a candidate query safely, and the execution-match reward.

Queries run on a read-only connection with a step budget, so a model's SQL can neither change
the database nor hang the agent. An execution error is a result too: the agent shows it to the
Rewriter, and the AIR deriver turns it into an intermediate penalty.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from examples.errors import ExamplesError

MAX_ROWS = 200
MAX_STEPS = 2_000_000  # SQLite VM instructions; a cartesian blow-up stops here


@dataclass(frozen=True)
class Execution:
    rows: list[tuple] | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def execute(db: str, sql: str) -> Execution:
    if not sql or not sql.strip():
        return Execution(None, "empty query; expected one SELECT statement")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    steps = {"n": 0}

    def budget() -> int:
        steps["n"] += 1
        return 1 if steps["n"] * 1000 > MAX_STEPS else 0

    conn.set_progress_handler(budget, 1000)
    try:
        rows = conn.execute(sql.strip().rstrip(";")).fetchmany(MAX_ROWS)
        return Execution(rows, None)
    # Syntax errors, unknown columns, read-only violations, the step budget; several
    # statements at once are a Warning on some Python versions, an Error on others.
    except (sqlite3.Error, sqlite3.Warning) as exc:
        return Execution(None, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def _normalise(rows: list[tuple]) -> list[tuple]:
    """Order-insensitive, with floats rounded: 'same result' as a person would judge it."""
    def cell(v):
        return round(v, 4) if isinstance(v, float) else v
    return sorted((tuple(cell(v) for v in row) for row in rows), key=repr)


def reward(db: str, sql: str, gold_sql: str) -> float:
    """1.0 when the candidate's result equals the gold query's result on `db`, else 0.0."""
    got, gold = execute(db, sql), execute(db, gold_sql)
    if gold.error is not None:
        raise ExamplesError(f"gold query fails on {db}: {gold.error}")
    if got.error is not None:
        return 0.0
    return 1.0 if _normalise(got.rows) == _normalise(gold.rows) else 0.0
