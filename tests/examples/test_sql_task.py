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
    ("DROP TABLE customers", "readonly"),
    ("SELEC 1", "syntax error"),
    ("", "empty query"),
    ("SELECT 1; SELECT 2", "one statement"),
])
def test_bad_queries_are_errors_not_crashes(tmp_path, sql, error):
    task = generate(1, seed=1, folder=tmp_path)[0]
    result = execute(task.db, sql)
    assert not result.ok and error in result.error.lower()
    assert execute(task.db, task.gold_sql).ok  # the database is untouched


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
