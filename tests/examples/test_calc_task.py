"""The calc task's parts: the safe calculator, the problem generator, the reward."""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

import pytest

from examples.calc.calculator import CalculatorError, evaluate, format_number
from examples.calc.phrasings import NAMES, PHRASINGS, UNITS
from examples.calc.problems import Problem, generate, read_jsonl, write_jsonl
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


SPLITS = ("train", "heldout")
# What varies within one phrasing: names, pronouns, units, and numbers in digits or in words.
_FILLERS = [
    (r"\b(" + "|".join(name for name, _ in NAMES) + r")\b", "NAME"),
    (r"\b(" + "|".join(sorted(UNITS, key=len, reverse=True)) + r")\b", "UNIT"),
    (r"\b([Hh]e|[Ss]he|him|[Hh]er|[Hh]is|himself|herself)\b", "PRONOUN"),
    (r"\b(twice|(two|three|four|five|six|seven|eight|nine|ten|eleven|twelve) times|half|third|"
     r"quarter|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth)\b", "WORDS"),
    (r"\d+", "#"),
]


def _skeleton(question: str) -> str:
    for pattern, placeholder in _FILLERS:
        question = re.sub(pattern, placeholder, question)
    return question


def _numbers(text: str) -> Counter:
    return Counter(int(token) for token in re.findall(r"\d+", text))


@pytest.mark.parametrize("split", SPLITS)
def test_generator_is_seeded_and_exact(split):
    first, again = generate(300, seed=7, split=split), generate(300, seed=7, split=split)
    assert first == again and first != generate(300, seed=8, split=split)
    for problem in first:
        assert isinstance(problem.answer, int) and 0 <= problem.answer < 10**7
        assert evaluate(problem.expression) == problem.answer, problem
    # the split is part of the seed: a held-out set does not repeat a training seed's numbers
    # (one-operation expressions, "194 / 2", come from a space small enough to meet by chance)
    other = "train" if split == "heldout" else "heldout"
    assert {p.expression for p in first if p.difficulty > 1}.isdisjoint(
        p.expression for p in generate(300, 7, split=other) if p.difficulty > 1)


@pytest.mark.parametrize("difficulties", [(1,), (2,), (3,), (1, 2, 3)])
def test_difficulty_is_the_number_of_operations(difficulties):
    problems = generate(300, seed=3, difficulties=difficulties, split="train")
    assert {p.difficulty for p in problems} == set(difficulties)
    for problem in problems:
        assert len(re.findall(r"[-+*/]", problem.expression)) == problem.difficulty, problem
    if max(difficulties) > 1:  # a sum or difference that is then multiplied needs parentheses
        assert any("(" in p.expression for p in problems)


@pytest.mark.parametrize("split", SPLITS)
def test_questions_are_mostly_stories_in_many_phrasings(split):
    problems = generate(2000, seed=11, split=split)
    bare = [p for p in problems if p.question.rstrip(".?").endswith(p.expression)
            or f" {p.expression} " in p.question]
    assert 0.05 < len(bare) / len(problems) < 0.3
    skeletons = {_skeleton(p.question) for p in problems}
    assert len(skeletons) >= 100
    # the story's numbers are the expression's: none dropped (but those said in words, which are
    # multipliers and divisors, and a quantity the expression uses twice, as in "{a} apples on
    # Monday and twice as many on Tuesday": a + a * 2) and none extra (but the distractor)
    for problem in problems:
        told = _numbers(problem.question) - Counter([problem.distractor] * (problem.distractor is not None))
        unsaid = _numbers(problem.expression) - told
        assert not told - _numbers(problem.expression), problem
        assert all(n <= 12 or n in told for n in unsaid), problem


def test_held_out_phrasings_never_reach_training():
    # sentence by sentence: a family, question form or distractor that both splits used would
    # show up as a shared sentence even where the rest of the question differs
    sentences = {split: {_skeleton(sentence) for p in generate(2000, seed=5, split=split)
                         for sentence in re.split(r"(?<=[.?]) ", p.question)}
                 for split in SPLITS}
    assert len(sentences["heldout"]) >= 50
    assert sentences["train"].isdisjoint(sentences["heldout"]), \
        sentences["train"] & sentences["heldout"]
    train, heldout = PHRASINGS["train"], PHRASINGS["heldout"]
    for part in ("questions", "distractors", "bare"):
        assert set(getattr(train, part)).isdisjoint(getattr(heldout, part)), part
    assert {f.name for f in train.families}.isdisjoint(f.name for f in heldout.families)


@pytest.mark.parametrize("split", SPLITS)
def test_distractor_numbers_play_no_part(split):
    problems = generate(2000, seed=13, split=split)
    with_distractor = [p for p in problems if p.distractor is not None]
    assert 0.1 < len(with_distractor) / len(problems) < 0.4
    for problem in with_distractor:
        assert problem.distractor in _numbers(problem.question)
        assert problem.distractor not in _numbers(problem.expression), problem
    # not always in the same place: some before the story's first sentence, some after it
    first_sentences = [p.question.split(". ")[0] for p in with_distractor]
    assert 0 < sum(str(p.distractor) in s for p, s in zip(with_distractor, first_sentences,
                                                             strict=True)) < len(with_distractor)


def test_problems_read_as_worked_by_hand():
    """A few problems checked by reading them: the story's words agree with the expression."""
    train = generate(5, seed=1, split="train")
    assert [train[1], train[2], train[4]] == [
        Problem("Nadia runs a small library with 343 books. A donor gives her 241 books. Readers "
                "borrow 295 books. Your task is to find how many books Nadia's library has.",
                289, 2, "343 + 241 - 295"),
        # a shape other than a chain (examples/calc/shapes.py): what is left after the balls, shared
        Problem("A club has 63 dollars. Mateo owns 14 board games. It buys 3 balls at 7 dollars "
                "each and splits the money left over equally among its 6 teams. How many dollars "
                "does each team get?", 7, 3, "(63 - 3 * 7) / 6", 14),
        # 102 less the 21 knocked over is 81, and three times that is 243
        Problem("In Goran's tower there are 102 elixirs. A clumsy apprentice knocks over 21 of the "
                "elixirs, and they are lost. Goran lives on floor 56 of a tall building. He "
                "enchants the shelf so that the number of elixirs is multiplied by 3. After the "
                "last change, how many elixirs does Goran have?", 243, 2, "(102 - 21) * 3", 56),
    ]
    assert generate(3, seed=1, split="heldout")[1:] == [
        Problem("Ben saves 59 dollars a month for 3 months. He takes out 127 dollars for a game. "
                "Figure out how many dollars Ben has saved.", 50, 2, "3 * 59 - 127"),
        Problem("The town has 73 street lamps. With 100 dollars in his pocket, Chen pays for 3 "
                "museum entries at 13 dollars a person and a 14-dollar guidebook. What is left in "
                "his pocket, in dollars?", 47, 3, "100 - 3 * 13 - 14", 73),
    ]


def test_generator_refuses_bad_arguments():
    with pytest.raises(ExamplesError, match="split 'test': expected one of train, heldout"):
        generate(5, seed=1, split="test")
    with pytest.raises(ExamplesError, match="difficulties"):
        generate(5, seed=1, difficulties=(4,))
    with pytest.raises(ExamplesError, match="n=-1"):
        generate(-1, seed=1)


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
