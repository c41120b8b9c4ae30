"""The text-to-SQL task's parts: seeded databases, safe execution, execution-match reward."""

from __future__ import annotations

import pytest

from examples.errors import ExamplesError
from examples.sql.databases import generate, read_jsonl, schema_text, write_jsonl
from examples.sql.execution import execute, reward


def test_generator_is_seeded_and_every_gold_query_runs(tmp_path):
    tasks = generate(12, seed=3, folder=tmp_path / "a")
    again = generate(12, seed=3, folder=tmp_path / "b")
    assert [(t.question, t.gold_sql) for t in tasks] == [(t.question, t.gold_sql) for t in again]
    for task, twin in zip(tasks, again, strict=True):
        assert execute(task.db, task.gold_sql).ok
        assert execute(task.db, task.gold_sql).rows == execute(twin.db, twin.gold_sql).rows
    assert "CREATE TABLE" in schema_text(tasks[0].db)


def test_reward_is_execution_match(tmp_path):
    task = generate(1, seed=1, folder=tmp_path)[0]  # "How many customers live in X?"
    assert task.gold_sql.startswith("SELECT COUNT(*) FROM customers")
    city = task.gold_sql.split("'")[1]
    equivalent = f"SELECT count(id) FROM customers WHERE city='{city}'"
    assert reward(task.db, equivalent, task.gold_sql) == 1.0
    assert reward(task.db, "SELECT COUNT(*) FROM customers", task.gold_sql) in (0.0, 1.0)
    assert reward(task.db, "SELECT nonsense FROM nowhere", task.gold_sql) == 0.0


def test_row_order_does_not_matter(tmp_path):
    task = generate(3, seed=1, folder=tmp_path)[2]  # a DISTINCT name list
    reversed_sql = task.gold_sql + " ORDER BY c.name DESC"
    assert reward(task.db, reversed_sql, task.gold_sql) == 1.0


@pytest.mark.parametrize("sql, error", [
    ("DROP TABLE customers", "delete on sqlite_master is not allowed"),
    ("SELEC 1", "syntax error"),
    ("", "empty query"),
    ("SELECT 1; SELECT 2", "one statement"),
])
def test_bad_queries_are_errors_not_crashes(tmp_path, sql, error):
    task = generate(1, seed=1, folder=tmp_path)[0]
    result = execute(task.db, sql)
    assert not result.ok and error in result.error.lower()
    assert execute(task.db, task.gold_sql).ok  # the database is untouched


@pytest.mark.parametrize("sql, refused", [
    ("ATTACH DATABASE '{folder}/other.sqlite' AS other", "ATTACH of '{folder}/other.sqlite'"),
    ("VACUUM INTO '{folder}/copy.sqlite'", "ATTACH of '{folder}/copy.sqlite'"),
    ("PRAGMA database_list", "PRAGMA database_list"),
    # a pragma's table-valued form: SQLite asks leave to update the schema table to set it up
    ("SELECT * FROM pragma_table_info('customers')", "UPDATE on sqlite_master"),
    ("INSERT INTO customers VALUES (99, 'Mallory', 'Oslo')", "INSERT on customers"),
    ("UPDATE customers SET name = 'Mallory'", "UPDATE on customers"),
    ("BEGIN", "BEGIN"),
    ("SAVEPOINT s", "SAVEPOINT"),
])
def test_anything_but_reading_is_refused_by_the_authorizer(tmp_path, sql, refused):
    """ATTACH and VACUUM INTO would create files outside the database; pragmas show paths and
    settings. Each is refused before it runs, with a message naming it."""
    task = generate(1, seed=1, folder=tmp_path / "db")[0]
    result = execute(task.db, sql.format(folder=tmp_path))
    assert not result.ok
    assert result.error == (f"{refused.format(folder=tmp_path)} is not allowed: expected one "
                            "read-only SELECT statement")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db"]  # no file was created
    assert execute(task.db, "SELECT COUNT(*) FROM customers").rows == [(6,)]


@pytest.mark.parametrize("sql, error", [
    # one value of 50 MB: SQLITE_LIMIT_LENGTH stops it inside SQLite
    ("SELECT length(randomblob(50000000))", "string or blob too big"),
    ("SELECT replace(hex(zeroblob(20000000)), '0', 'ab')", "string or blob too big"),
    # 200 rows of 60 KB each: every value is allowed, the result as a whole is not
    ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 200) "
     "SELECT randomblob(60000) FROM c", "result exceeds 1000000 bytes after 16 rows"),
])
def test_result_sizes_are_bounded(tmp_path, sql, error):
    task = generate(1, seed=1, folder=tmp_path)[0]
    result = execute(task.db, sql)
    assert not result.ok and error in result.error


def test_rows_are_capped(tmp_path):
    task = generate(1, seed=1, folder=tmp_path)[0]
    result = execute(task.db, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                              "LIMIT 5000) SELECT x FROM c")
    assert result.ok and len(result.rows) == 200


def test_runaway_query_is_stopped(tmp_path):
    task = generate(1, seed=1, folder=tmp_path)[0]
    result = execute(task.db, "SELECT COUNT(*) FROM orders a, orders b, orders c, orders d, orders e, orders f")
    assert not result.ok and "interrupt" in result.error.lower()


def test_tasks_file_round_trip(tmp_path):
    tasks = generate(4, seed=2, folder=tmp_path)
    write_jsonl(tasks, tmp_path / "t.jsonl")
    assert read_jsonl(tmp_path / "t.jsonl") == tasks
    (tmp_path / "bad.jsonl").write_text('{"db": "x"}\n')
    with pytest.raises(ExamplesError, match=r"missing \['gold_sql', 'question'\]"):
        read_jsonl(tmp_path / "bad.jsonl")
