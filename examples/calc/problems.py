"""Seeded arithmetic word problems with one to three operations and exact integer answers,
told in many phrasings, with the phrasings of a held-out split never used in training.

    from examples.calc.problems import generate
    problems = generate(n=200, seed=1)                    # training traffic's phrasings
    heldout = generate(n=200, seed=1, split="heldout")   # scenarios and questions never trained on

Each Problem holds the question, its integer answer, its difficulty (the number of operations,
1 to 3) and the expression that gives the answer (`calculator.evaluate(expression) == answer`,
which the tests check). Most are small stories, and most stories change one running quantity
step by step (examples/calc/phrasings.py: shopping, baking, a bus route, ...): an opening
sentence, one sentence per further operation, a question; SHAPE_SHARE of the stories have
another shape (examples/calc/shapes.py: change from a payment, two related parts, what is left of
a whole, items packed into boxes, ...) with as many operations, where the split has one. About
a quarter of all stories have a sentence with a number that plays no part
(`Problem.distractor`). About one in seven problems is a bare expression ("What is (12 + 7) *
3?"). Operations are + - * / on non-negative integers, with every division exact and every
result below 10**7.

The `train` and `heldout` splits share no scenario family, question form, distractor sentence,
bare-expression form or shape template, and some shapes are told in the held-out split only
(shapes.HELDOUT_ONLY), so held-out accuracy measures phrasings and kinds of problem the agent
never trained on, not only numbers; the split is part of the seed, so the two draw different
numbers too. The same (n, seed, difficulties, split) gives the same problems.

Since the shapes came in, a seed gives other problems than before in both splits, the held-out
set included: held-out accuracies measured before then are on another set (fewer kinds of
problem) and compare with later ones only roughly.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from examples.calc.phrasings import NAMES, PHRASINGS, SPLITS, Family
from examples.calc.shapes import Shape, shapes
from examples.errors import ExamplesError

BARE_SHARE = 0.15
SHAPE_SHARE = 0.3  # of the story problems: another shape than a chain (examples/calc/shapes.py)
DISTRACTOR_SHARE = 0.25
_INVERSE = {"+": "-", "-": "+", "*": "/", "/": "*"}
_PRONOUNS = {"she": ("she", "her", "her", "herself"), "he": ("he", "him", "his", "himself")}
# {times} and {nth} of the multipliers and divisors (2 to 12) in words
_TIMES = {2: "twice", 3: "three times", 4: "four times", 5: "five times", 6: "six times",
          7: "seven times", 8: "eight times", 9: "nine times", 10: "ten times",
          11: "eleven times", 12: "twelve times"}
_NTH = {2: "half", 3: "third", 4: "quarter", 5: "fifth", 6: "sixth", 7: "seventh", 8: "eighth",
        9: "ninth", 10: "tenth", 11: "eleventh", 12: "twelfth"}


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int
    difficulty: int
    expression: str
    distractor: int | None = None  # the number in the question that plays no part


@dataclass
class _Chain:
    """A left-to-right computation: its value so far, its expression, its later steps."""
    value: int
    expression: str
    top: str | None  # the last operator applied, which decides whether a new one needs parentheses
    top_operands: tuple[int, ...]  # its right-hand operands (both of an opening product)
    steps: list[tuple[str, int]]  # (operator, operand) after the opening

    def apply(self, op: str, n: int) -> None:
        left = f"({self.expression})" if op in "*/" and self.top in ("+", "-") else self.expression
        self.expression, self.top, self.top_operands = f"{left} {op} {n}", op, (n,)
        self.value = {"+": self.value + n, "-": self.value - n, "*": self.value * n,
                      "/": self.value // n}[op]
        self.steps.append((op, n))


def _opening(rng: random.Random, kind: str) -> tuple[_Chain, dict]:
    """The first quantity: a plain number, or a product or an exact share (one operation)."""
    if kind == "start":
        a = rng.randint(12, 400)
        return _Chain(a, str(a), None, (), []), {"a": a}
    if kind == "product":
        a, b = rng.randint(2, 30), rng.randint(3, 60)
        return _Chain(a * b, f"{a} * {b}", "*", (a, b), []), {"a": a, "b": b}
    b, each = rng.randint(2, 12), rng.randint(5, 150)
    return _Chain(each, f"{each * b} / {b}", "/", (b,), []), {"a": each * b, "b": b}


def _step(rng: random.Random, chain: _Chain) -> None:
    operands = {"+": range(2, 301), "-": range(1, min(chain.value - 1, 300) + 1),
                "*": range(2, 10), "/": [d for d in range(2, 13) if chain.value % d == 0]}
    # never the same operator twice running: with at least two templates per operator, no
    # story then repeats a sentence ("gets 5 more. ... gets 7 more.")
    if chain.steps:
        del operands[chain.steps[-1][0]]
    # nor a step that undoes the one before ("* 9 / 9"): it teaches nothing
    undone = _INVERSE.get(chain.top)
    if undone in operands:
        operands[undone] = [n for n in operands[undone] if n not in chain.top_operands]
    op = rng.choice([op for op, choices in operands.items() if choices])
    chain.apply(op, rng.choice(operands[op]))


def _chain(rng: random.Random, n_ops: int) -> tuple[_Chain, str, dict]:
    kind = rng.choices(("start", "product", "share"), weights=(2, 1, 1))[0]
    chain, numbers = _opening(rng, kind)
    for _ in range(n_ops - (kind != "start")):
        _step(rng, chain)
    return chain, kind, numbers


def _person(rng: random.Random) -> dict:
    """The story's person, with pronouns, and another name for a distractor to mention."""
    (who, pronoun), (other, _) = rng.sample(NAMES, 2)
    he, him, his, self = _PRONOUNS[pronoun]
    return {"who": who, "he": he, "He": he.capitalize(), "him": him, "his": his,
            "His": his.capitalize(), "self": self, "other": other}


def _story(rng: random.Random, family: Family, chain: _Chain, kind: str, numbers: dict,
           person: dict, question_form: str) -> list[str]:
    words = {**person, "unit": rng.choice(family.units)}
    opening = {"start": family.starts, "product": family.products, "share": family.shares}[kind]
    sentences, used = [rng.choice(opening).format(**words, **numbers)], []
    for op, n in chain.steps:
        unused = [template for template in family.steps(op) if template not in used]
        used.append(rng.choice(unused))
        in_words = {"times": _TIMES[n], "nth": _NTH[n]} if n in _TIMES else {}
        sentences.append(used[-1].format(**words, n=n, **in_words))
    ask = family.ask.format(**words)
    sentences.append(question_form.format(Ask=ask, ask=ask[0].lower() + ask[1:],
                                          tell=family.tell.format(**words)))
    return sentences


def _shape_story(rng: random.Random, shape: Shape, split: str,
                 person: dict) -> tuple[list[str], str, int]:
    """A problem of another shape than a chain (examples/calc/shapes.py): its sentences, its
    expression and its answer."""
    numbers, answer = shape.draw(rng)
    n = numbers.get("n")
    in_words = {"times": _TIMES[n], "nth": _NTH[n]} if n in _TIMES else {}
    text = rng.choice(shape.templates[split]).format(**person, **numbers, **in_words)
    return re.split(r"(?<=[.?]) ", text), shape.expression.format(**numbers), answer


def _problem(rng: random.Random, n_ops: int, split: str) -> Problem:
    phrasings = PHRASINGS[split]
    chain, kind, numbers = _chain(rng, n_ops)
    if rng.random() < BARE_SHARE:
        question = rng.choice(phrasings.bare).format(expression=chain.expression)
        return Problem(question, chain.value, n_ops, chain.expression)
    person, fitting = _person(rng), shapes(split, n_ops)
    # a shape that tells `n_ops` operations, or (where the split has none) a chain story
    if rng.random() < SHAPE_SHARE and fitting:
        sentences, expression, answer = _shape_story(rng, rng.choice(fitting), split, person)
    else:
        family, question_form = rng.choice(phrasings.families), rng.choice(phrasings.questions)
        sentences = _story(rng, family, chain, kind, numbers, person, question_form)
        expression, answer = chain.expression, chain.value
    distractor = None
    if rng.random() < DISTRACTOR_SHARE:
        used = {int(token) for token in expression.replace("(", " ").replace(")", " ").split()
                if token.isdigit()}
        distractor = rng.choice([k for k in range(3, 100) if k not in used])
        # anywhere before the question, the opening included: the agent must not rely on position
        sentences.insert(rng.randint(0, len(sentences) - 1),
                         rng.choice(phrasings.distractors).format(**person, k=distractor))
    return Problem(" ".join(sentences), answer, n_ops, expression, distractor)


def generate(n: int, seed: int, difficulties: tuple[int, ...] = (1, 2, 3),
             split: str = "train") -> list[Problem]:
    """`n` problems cycling through `difficulties` (numbers of operations), deterministic for
    `seed`, in the phrasings of `split` (`train` for traffic, `heldout` for evaluation)."""
    if n < 0:
        raise ExamplesError(f"n={n}: expected a count >= 0")
    unknown = set(difficulties) - {1, 2, 3}
    if unknown or not difficulties:
        raise ExamplesError(f"difficulties {difficulties}: expected values among 1, 2, 3")
    if split not in SPLITS:
        raise ExamplesError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    # the split is part of the seed, so a held-out set never repeats a training seed's numbers
    rng = random.Random(f"{split}:{seed}")
    return [_problem(rng, difficulties[i % len(difficulties)], split) for i in range(n)]


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
