"""The calc task's parts: the safe calculator, the problem generator, the reward."""

from __future__ import annotations

from fractions import Fraction

import pytest

from examples.calc.calculator import CalculatorError, evaluate, format_number
from examples.calc.problems import generate, read_jsonl, write_jsonl
from examples.calc.reward import final_answer, reward
from examples.errors import ExamplesError


@pytest.mark.parametrize("expression, value", [
    ("17*23", 391), ("(3+4)*12", 84), ("-5 + 2", -3), ("7/2", Fraction(7, 2)),
    ("2**10", 1024), ("100 // 7", 14), ("100 % 7", 2), ("1.5*4", 6), ("12 × 3", 36),
])
def test_calculator_evaluates_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('ls')", "is not allowed"),
    ("open('/etc/passwd')", "is not allowed"),
    ("x + 1", r"'x' in 'x \+ 1' is not allowed"),
    ("'a' * 3", "is not allowed"),
    ("(1).__class__", "is not allowed"),
    ("2 ** 100000", "exponent 100000"),
    ("1/0", "division by zero"),
    ("3 +", "is not an arithmetic expression"),
    ("", "empty expression"),
    ("9" * 300, "at most 200"),
    ("10**12 * 10**12", "exceeds"),
    # float literals beyond a double are infinity: an overflow, not a crash of the episode
    ("1e999", r"a number in '1e999' overflows"),
    ("-1e999 + 1", "overflows"),
    ("1e400 / 1e400", "overflows"),
    ("1e300", "exceeds"),
])
def test_calculator_rejects_anything_but_arithmetic(expression, message):
    with pytest.raises(CalculatorError, match=message):
        evaluate(expression)


def test_format_number():
    assert format_number(Fraction(119)) == "119"
    assert format_number(Fraction(5, 2)) == "2.5"


def test_generator_is_seeded_graded_and_exact():
    first, again, other = generate(60, seed=7), generate(60, seed=7), generate(60, seed=8)
    assert first == again and first != other
    assert {p.difficulty for p in first} == {1, 2, 3}
    for problem in first:
        assert evaluate(problem.expression) == problem.answer
        assert isinstance(problem.answer, int)
    assert any("(" in p.expression for p in first if p.difficulty == 3)


def test_problems_file_round_trip(tmp_path):
    problems = generate(10, seed=1)
    write_jsonl(problems, tmp_path / "p.jsonl")
    back = read_jsonl(tmp_path / "p.jsonl")
    assert [(p.question, p.answer) for p in back] == [(p.question, p.answer) for p in problems]
    (tmp_path / "bad.jsonl").write_text('{"q": 1}\n')
    with pytest.raises(ExamplesError, match="bad.jsonl:1"):
        read_jsonl(tmp_path / "bad.jsonl")


def test_reward_is_exact_final_answer():
    assert reward("I think 12.\nANSWER: 391", 391) == 1.0
    assert reward("ANSWER: 390", 391) == 0.0
    assert reward("ANSWER: 1,024", 1024) == 1.0
    assert reward("391", 391) == 0.0  # no final answer line
    assert final_answer("ANSWER: 3 then ANSWER: 4") == "4"
