"""Running a candidate query safely, and the execution-match reward.

A model's SQL is untrusted text. It runs on a read-only connection whose authorizer lets
through only what one SELECT needs (reading tables, calling functions, recursive CTEs):
ATTACH (which creates files), VACUUM INTO (which writes one), pragmas, writes and transaction
statements are refused before they run. SQLite's own limits bound every string and blob a
query builds, a step budget bounds its work, and the rows fetched are bounded in count and in
bytes, so a query can neither change anything, nor hang the agent, nor build a gigabyte. An
execution error is a result too: the agent shows it to the Rewriter, and the AIR deriver turns
it into an intermediate penalty.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from examples.errors import ExamplesError

MAX_ROWS = 200
MAX_STEPS = 2_000_000  # SQLite VM instructions; a cartesian blow-up stops here
# An answer to a question about these databases is a few short values: a longer value, or a
# bigger result, is a runaway query, refused before Python holds it.
MAX_VALUE_BYTES = 100_000  # SQLITE_LIMIT_LENGTH: any string, blob or row SQLite builds
MAX_RESULT_BYTES = 1_000_000  # all fetched rows together
MAX_COLUMNS = 64  # SQLITE_LIMIT_COLUMN: the schemas have at most five
MAX_SQL_CHARS = 20_000  # SQLITE_LIMIT_SQL_LENGTH

_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
            sqlite3.SQLITE_RECURSIVE}
_ACTIONS = {getattr(sqlite3, name): name[len("SQLITE_"):].replace("_", " ") for name in (
    "SQLITE_ATTACH", "SQLITE_DETACH", "SQLITE_PRAGMA", "SQLITE_INSERT", "SQLITE_UPDATE",
    "SQLITE_DELETE", "SQLITE_TRANSACTION", "SQLITE_SAVEPOINT", "SQLITE_ANALYZE",
    "SQLITE_REINDEX", "SQLITE_ALTER_TABLE", "SQLITE_CREATE_TABLE", "SQLITE_CREATE_INDEX",
    "SQLITE_CREATE_VIEW", "SQLITE_CREATE_TRIGGER", "SQLITE_CREATE_TEMP_TABLE",
    "SQLITE_CREATE_TEMP_INDEX", "SQLITE_CREATE_TEMP_VIEW", "SQLITE_CREATE_TEMP_TRIGGER",
    "SQLITE_CREATE_VTABLE", "SQLITE_DROP_TABLE", "SQLITE_DROP_INDEX", "SQLITE_DROP_VIEW",
    "SQLITE_DROP_TRIGGER", "SQLITE_DROP_TEMP_TABLE", "SQLITE_DROP_TEMP_INDEX",
    "SQLITE_DROP_TEMP_VIEW", "SQLITE_DROP_TEMP_TRIGGER", "SQLITE_DROP_VTABLE")}


@dataclass(frozen=True)
class Execution:
    rows: list[tuple] | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def _describe(action: int, arg1: str | None) -> str:
    what = _ACTIONS.get(action, f"authorizer action {action}")
    if action == sqlite3.SQLITE_TRANSACTION:
        return arg1 or what  # BEGIN, COMMIT or ROLLBACK
    if action == sqlite3.SQLITE_PRAGMA:
        return f"{what} {arg1}"
    if action == sqlite3.SQLITE_ATTACH:
        return f"{what} of {arg1!r}"
    if action == sqlite3.SQLITE_SAVEPOINT or not arg1:
        return what
    return f"{what} on {arg1}"


class _Guard:
    """The connection's authorizer and step budget; remembers what it refused, for the message."""

    def __init__(self):
        self.steps = 0
        self.refused: str | None = None

    def authorize(self, action: int, arg1, arg2, db_name, trigger) -> int:
        if action in _ALLOWED:
            return sqlite3.SQLITE_OK
        if self.refused is None:  # the first refusal stops the statement
            self.refused = _describe(action, arg1)
        return sqlite3.SQLITE_DENY

    def budget(self) -> int:
        self.steps += 1
        return 1 if self.steps * 1000 > MAX_STEPS else 0


def _connect(db: str, guard: _Guard) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, MAX_COLUMNS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(guard.authorize)
    conn.set_progress_handler(guard.budget, 1000)
    return conn


def _size(value) -> int:
    return len(value) if isinstance(value, str | bytes) else 8


def _fetch(cursor: sqlite3.Cursor) -> list[tuple]:
    rows, size = [], 0
    for row in cursor:
        size += sum(_size(v) for v in row)
        if size > MAX_RESULT_BYTES:
            raise ExamplesError(f"result exceeds {MAX_RESULT_BYTES} bytes after {len(rows)} "
                                "rows; expected a small answer")
        rows.append(row)
        if len(rows) == MAX_ROWS:
            break
    return rows


def execute(db: str, sql: str) -> Execution:
    if not sql or not sql.strip():
        return Execution(None, "empty query; expected one SELECT statement")
    guard = _Guard()
    conn = _connect(db, guard)
    try:
        return Execution(_fetch(conn.execute(sql.strip().rstrip(";"))), None)
    # Syntax errors, unknown columns, refused statements, the limits, the step budget; several
    # statements at once are a Warning on some Python versions, an Error on others.
    except (sqlite3.Error, sqlite3.Warning) as exc:
        if guard.refused is not None:
            return Execution(None, f"{guard.refused} is not allowed: expected one read-only "
                                   "SELECT statement")
        return Execution(None, f"{type(exc).__name__}: {exc}")
    except ExamplesError as exc:
        return Execution(None, str(exc))
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
