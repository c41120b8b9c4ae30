"""Seeded arithmetic word problems of graded difficulty, with exact integer answers.

    from examples.calc.problems import generate
    problems = generate(n=200, seed=1)      # list of Problem(question, answer, difficulty)

Difficulty 1: one operation on two-digit numbers; 2: two operations, three-digit numbers;
3: three operations with parentheses. Divisions are generated exact, so every answer is an
integer. The same (n, seed) gives the same problems; held-out sets use seeds never trained on.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from examples.calc.calculator import evaluate
from examples.errors import ExamplesError

_TEMPLATES = {
    "+": ["{who} has {a} {things} and gets {b} more. How many {things} does {who} have now?",
          "What is {a} plus {b}?"],
    "-": ["{who} had {a} {things} and gave away {b}. How many {things} are left?",
          "What is {a} minus {b}?"],
    "*": ["{who} buys {a} boxes with {b} {things} each. How many {things} in total?",
          "What is {a} times {b}?"],
    "/": ["{who} shares {a} {things} equally among {b} friends. How many does each get?",
          "What is {a} divided by {b}?"],
}
_WHO = ["Ada", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana"]
_THINGS = ["apples", "marbles", "stamps", "coins", "books", "pencils"]


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int
    difficulty: int
    expression: str


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _single(rng: random.Random, digits: int) -> Problem:
    op = rng.choice("+-*/")
    a, b = _operand(rng, digits), _operand(rng, max(1, digits - (op in "*/")))
    if op == "/":
        a = a * b  # exact division
    if op == "-" and b > a:
        a, b = b, a
    expression = f"{a} {op} {b}"
    text = rng.choice(_TEMPLATES[op]).format(who=rng.choice(_WHO), things=rng.choice(_THINGS), a=a, b=b)
    return Problem(text, int(evaluate(expression)), 1 if digits <= 2 else 2, expression)


def _compound(rng: random.Random, n_ops: int, digits: int) -> Problem:
    while True:
        terms = [str(_operand(rng, digits))]
        for _ in range(n_ops):
            terms += [rng.choice("+-*"), str(_operand(rng, digits))]
        if n_ops >= 3:  # parenthesise the first operation
            terms = ["(", *terms[:3], ")", *terms[3:]]
        expression = " ".join(terms).replace("( ", "(").replace(" )", ")")
        value = evaluate(expression)
        if value.denominator == 1 and 0 <= value < 10**7:
            return Problem(f"Compute {expression}.", int(value), min(3, n_ops), expression)


def generate(n: int, seed: int, difficulties: tuple[int, ...] = (1, 2, 3)) -> list[Problem]:
    """`n` problems cycling through `difficulties`, deterministic for `seed`."""
    if n < 0:
        raise ExamplesError(f"n={n}: expected a count >= 0")
    unknown = set(difficulties) - {1, 2, 3}
    if unknown or not difficulties:
        raise ExamplesError(f"difficulties {difficulties}: expected values among 1, 2, 3")
    rng = random.Random(seed)
    problems = []
    for i in range(n):
        level = difficulties[i % len(difficulties)]
        if level == 1:
            problems.append(_single(rng, 2))
        elif level == 2:
            problems.append(_single(rng, 3) if rng.random() < 0.5 else _compound(rng, 2, 2))
        else:
            problems.append(_compound(rng, 3, 2))
    return problems


def write_jsonl(problems: list[Problem], path: Path) -> None:
    with open(path, "w") as out:
        for problem in problems:
            out.write(json.dumps({"question": problem.question, "answer": problem.answer}) + "\n")


def read_jsonl(path: Path) -> list[Problem]:
    problems = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "question" not in row or "answer" not in row:
            raise ExamplesError(f"{path}:{number}: expected {{\"question\": ..., \"answer\": ...}}")
        problems.append(Problem(row["question"], int(row["answer"]), 0, ""))
    return problems


__all__ = ["Problem", "generate", "write_jsonl", "read_jsonl", "asdict"]
