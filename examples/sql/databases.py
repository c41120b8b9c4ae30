"""Seeded small SQLite databases with questions and gold queries.

    from examples.sql.databases import generate
    tasks = generate(n=50, seed=1, folder=Path("dbs"))   # list of SqlTask(db, question, gold_sql)

Each database is one of a few schemas (shop, school, library) filled with seeded rows; each
question comes from a template with its gold query, so the expected result is whatever the
gold query returns on that database. Same (n, seed) gives the same files and tasks.
"""

from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from examples.errors import ExamplesError

SCHEMAS = {
    "shop": [
        "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT)",
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), amount INTEGER, year INTEGER)",
    ],
    "school": [
        "CREATE TABLE students (id INTEGER PRIMARY KEY, name TEXT, grade INTEGER)",
        "CREATE TABLE scores (student_id INTEGER REFERENCES students(id), subject TEXT, score INTEGER)",
    ],
    "library": [
        "CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT, country TEXT)",
        "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT, author_id INTEGER REFERENCES authors(id), pages INTEGER, year INTEGER)",
    ],
}
_NAMES = ["Ada", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun"]
_CITIES = ["Oslo", "Lima", "Pune", "Kyiv", "Perth"]
_SUBJECTS = ["math", "art", "history"]
_COUNTRIES = ["Peru", "Japan", "Chile", "Kenya"]


@dataclass(frozen=True)
class SqlTask:
    db: str
    question: str
    gold_sql: str


def _fill(kind: str, conn: sqlite3.Connection, rng: random.Random) -> None:
    if kind == "shop":
        for i, name in enumerate(rng.sample(_NAMES, 6), 1):
            conn.execute("INSERT INTO customers VALUES (?, ?, ?)", (i, name, rng.choice(_CITIES)))
        for i in range(1, 21):
            conn.execute("INSERT INTO orders VALUES (?, ?, ?, ?)",
                         (i, rng.randint(1, 6), rng.randint(5, 500), rng.choice([2023, 2024, 2025])))
    elif kind == "school":
        for i, name in enumerate(rng.sample(_NAMES, 7), 1):
            conn.execute("INSERT INTO students VALUES (?, ?, ?)", (i, name, rng.randint(9, 12)))
            for subject in _SUBJECTS:
                conn.execute("INSERT INTO scores VALUES (?, ?, ?)", (i, subject, rng.randint(40, 100)))
    else:
        for i, name in enumerate(rng.sample(_NAMES, 5), 1):
            conn.execute("INSERT INTO authors VALUES (?, ?, ?)", (i, name, rng.choice(_COUNTRIES)))
        for i in range(1, 16):
            conn.execute("INSERT INTO books VALUES (?, ?, ?, ?, ?)",
                         (i, f"Book {i}", rng.randint(1, 5), rng.randint(80, 900), rng.randint(1990, 2024)))


def _questions(kind: str, rng: random.Random) -> list[tuple[str, str]]:
    if kind == "shop":
        city, year, amount = rng.choice(_CITIES), rng.choice([2023, 2024, 2025]), rng.randint(50, 400)
        return [
            (f"How many customers live in {city}?", f"SELECT COUNT(*) FROM customers WHERE city = '{city}'"),
            (f"What is the total amount of orders in {year}?", f"SELECT SUM(amount) FROM orders WHERE year = {year}"),
            (f"List the names of customers with an order above {amount}.",
             f"SELECT DISTINCT c.name FROM customers c JOIN orders o ON o.customer_id = c.id WHERE o.amount > {amount}"),
        ]
    if kind == "school":
        subject, grade = rng.choice(_SUBJECTS), rng.randint(9, 12)
        return [
            (f"How many students are in grade {grade}?", f"SELECT COUNT(*) FROM students WHERE grade = {grade}"),
            (f"What is the highest {subject} score?", f"SELECT MAX(score) FROM scores WHERE subject = '{subject}'"),
            (f"Which student has the best {subject} score?",
             f"SELECT s.name FROM students s JOIN scores x ON x.student_id = s.id WHERE x.subject = '{subject}' ORDER BY x.score DESC LIMIT 1"),
        ]
    country, year = rng.choice(_COUNTRIES), rng.randint(1995, 2020)
    return [
        (f"How many authors are from {country}?", f"SELECT COUNT(*) FROM authors WHERE country = '{country}'"),
        (f"How many books were published after {year}?", f"SELECT COUNT(*) FROM books WHERE year > {year}"),
        (f"What is the average number of pages of books by authors from {country}?",
         f"SELECT AVG(b.pages) FROM books b JOIN authors a ON a.id = b.author_id WHERE a.country = '{country}'"),
    ]


def schema_text(db: str | Path) -> str:
    """The CREATE statements of a database, as the Writer sees them."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
    return ";\n".join(r[0] for r in rows) + ";"


def generate(n: int, seed: int, folder: Path) -> list[SqlTask]:
    """`n` tasks over ceil(n/3) seeded databases written into `folder`."""
    if n < 0:
        raise ExamplesError(f"n={n}: expected a count >= 0")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    tasks: list[SqlTask] = []
    index = 0
    while len(tasks) < n:
        kind = list(SCHEMAS)[index % len(SCHEMAS)]
        path = folder / f"{kind}-{seed}-{index}.sqlite"
        path.unlink(missing_ok=True)
        with sqlite3.connect(path) as conn:
            for statement in SCHEMAS[kind]:
                conn.execute(statement)
            _fill(kind, conn, rng)
        tasks += [SqlTask(str(path), q, sql) for q, sql in _questions(kind, rng)]
        index += 1
    return tasks[:n]


def write_jsonl(tasks: list[SqlTask], path: Path) -> None:
    with open(path, "w") as out:
        for task in tasks:
            out.write(json.dumps({"db": task.db, "question": task.question, "gold_sql": task.gold_sql}) + "\n")


def read_jsonl(path: Path) -> list[SqlTask]:
    tasks = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = {"db", "question", "gold_sql"} - set(row)
        if missing:
            raise ExamplesError(f"{path}:{number}: missing {sorted(missing)}; expected db, question, gold_sql")
        tasks.append(SqlTask(row["db"], row["question"], row["gold_sql"]))
    return tasks
