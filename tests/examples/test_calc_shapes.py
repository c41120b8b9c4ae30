"""The calc problems of other shapes than a chain (examples/calc/shapes.py), alone and as
examples/calc/problems.py mixes them in."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from examples.calc import problems as calc_problems
from examples.calc.calculator import evaluate
from examples.calc.phrasings import UNITS
from examples.calc.problems import SHAPE_SHARE, Problem, generate
from examples.calc.shapes import HELDOUT_ONLY, SHAPES, Shape, shapes

SPLITS = ("train", "heldout")
_SENTENCES = re.compile(r"(?<=[.?]) ")


def _pattern(template: str) -> re.Pattern:
    return re.compile(re.sub(r"\\\{\w+\\\}", "(.+?)", re.escape(template)))


_PATTERNS = {split: [(shape.name, _pattern(t)) for shape in SHAPES
                     for t in shape.templates.get(split, ())] for split in SPLITS}


def _shape_of(problem: Problem, split: str) -> str | None:
    """The shape whose template `problem` was told in (its distractor sentence left out), or None
    for a chain story or a bare expression."""
    story = " ".join(sentence for sentence in _SENTENCES.split(problem.question)
                     if str(problem.distractor) not in re.findall(r"\d+", sentence))
    names = {name for name, pattern in _PATTERNS[split] if pattern.fullmatch(story)}
    assert len(names) <= 1, (problem, names)
    return names.pop() if names else None


@pytest.fixture(scope="module")
def generated() -> dict[str, list[Problem]]:
    return {split: [p for seed in (1, 2, 3) for p in generate(1000, seed, split=split)]
            for split in SPLITS}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.name)
def test_a_shape_draws_exact_whole_answers_that_every_template_tells(shape: Shape):
    rng = random.Random(shape.name)
    for _ in range(500):
        numbers, answer = shape.draw(rng)
        assert evaluate(shape.expression.format(**numbers)) == answer, (shape.name, numbers)
        assert isinstance(answer, int) and 0 <= answer < 10**7
        # every number is told: in digits, or {n} in words as {times}/{nth}
        for template in (t for split in shape.templates.values() for t in split):
            told = set(re.findall(r"\{(\w+)\}", template))
            needed = set(re.findall(r"\{(\w+)\}", shape.expression))
            assert needed - told <= ({"n"} if told & {"times", "nth"} else set()), template


@pytest.mark.parametrize("split", SPLITS)
def test_every_problem_is_exact(split, generated):
    for problem in generated[split]:
        assert isinstance(problem.answer, int) and 0 <= problem.answer < 10**7, problem
        assert evaluate(problem.expression) == problem.answer, problem
        assert "{" not in problem.question and "}" not in problem.question, problem
        assert len(re.findall(r"[-+*/]", problem.expression)) == problem.difficulty, problem


@pytest.mark.parametrize("split", SPLITS)
def test_each_shape_of_a_split_appears_in_about_its_share(split, generated):
    told = Counter(_shape_of(p, split) for p in generated[split])
    assert set(told) - {None} == {s.name for s in SHAPES if split in s.templates}
    stories = [p for p in generated[split] if p.expression not in p.question]  # not bare
    shaped = len(generated[split]) - told[None]
    assert shaped / len(stories) == pytest.approx(SHAPE_SHARE, abs=0.04)


def test_held_out_shapes_are_whole_kinds_never_trained_on(generated):
    assert len(HELDOUT_ONLY) >= 2
    assert all(shape.name not in HELDOUT_ONLY for ops in (1, 2, 3) for shape in shapes("train", ops))
    # the held-out templates' wording never shows up in training traffic
    heldout_only = [pattern for name, pattern in _PATTERNS["heldout"] if name in HELDOUT_ONLY]
    for problem in generated["train"]:
        assert not any(pattern.search(problem.question) for pattern in heldout_only), problem
    assert {_shape_of(p, "heldout") for p in generated["heldout"]} >= set(HELDOUT_ONLY)


def _sentence_skeletons(split: str) -> set[str]:
    skeletons = set()
    for shape in SHAPES:
        for template in shape.templates.get(split, ()):
            for sentence in _SENTENCES.split(template):
                sentence = re.sub(r"\{\w+\}", "{}", sentence)
                skeletons.add(re.sub(r"\b(" + "|".join(UNITS) + r")\b", "UNIT", sentence))
    return skeletons


def test_splits_share_no_shape_sentence():
    train, heldout = _sentence_skeletons("train"), _sentence_skeletons("heldout")
    assert len(heldout) >= 40
    assert train.isdisjoint(heldout), train & heldout


@pytest.mark.parametrize("difficulties", [(1,), (2,), (3,)])
def test_a_shape_tells_as_many_operations_as_asked(difficulties):
    for split in SPLITS:
        problems = generate(600, seed=4, difficulties=difficulties, split=split)
        told = {_shape_of(p, split) for p in problems} - {None}
        assert told and told <= {s.name for s in shapes(split, difficulties[0])}


def test_chain_stories_stand_in_where_no_shape_fits(monkeypatch):
    monkeypatch.setattr(calc_problems, "shapes",
                        lambda split, ops: [s for s in shapes(split, ops) if s.ops != 3])
    problems = generate(600, seed=4, difficulties=(2, 3), split="train")
    assert {p.difficulty for p in problems if _shape_of(p, "train")} == {2}
    assert sum(p.difficulty == 3 for p in problems) == 300


def test_shapes_read_as_worked_by_hand():
    """Checked by reading: 7 bowls at 36 euros are 252, and 500 less 252 is 248 (Kofi's
    favourite number plays no part); 6 boxes of 19 are 114 of 240 apples, and the other 126
    shared by 7 are 18 each; 5 tickets at 29 are 145, and 200 less 145 less 28 is 27."""
    assert generate(11, seed=1, split="train")[10] == Problem(
        "Kofi wants 7 bowls of noodles at 36 euros a bowl and gives the waiter 500 euros. Kofi's "
        "favourite number is 84. How many euros does the waiter bring back?", 248, 2,
        "500 - 7 * 36", 84)
    heldout = generate(9, seed=1, split="heldout")
    assert heldout[8] == Problem(
        "A farmer picks 240 apples, sells 6 boxes of 19 apples each, and divides the remaining "
        "apples equally among 7 neighbours. How many apples does each neighbour receive?",
        18, 3, "(240 - 6 * 19) / 7")
    assert heldout[5] == Problem(
        "Mateo books 5 concert tickets at 29 pounds each plus a 28-pound booking fee and hands "
        "over 200 pounds. How many pounds does he get back?", 27, 3, "200 - 5 * 29 - 28")
