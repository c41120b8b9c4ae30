"""The independent calc set (bench/data/calc_independent.jsonl): 60 word problems written by
hand by someone who had not read the generator, for measuring whether what the demo teaches
carries past the generator's phrasing (README, the demo). Never trained on; the generator must
never be changed to match it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from examples.calc.calculator import evaluate
from examples.calc.problems import generate, read_jsonl

SET = Path(__file__).parents[2] / "bench" / "data" / "calc_independent.jsonl"


def test_every_answer_is_its_expressions_and_the_eval_reads_the_file():
    rows = [json.loads(line) for line in SET.read_text().splitlines()]
    assert Counter(r["kind"] for r in rows) == {"chain": 44, "other": 16}
    for row in rows:
        assert evaluate(row["expression"]) == row["answer"], row["question"]
    assert [p.answer for p in read_jsonl(SET)] == [r["answer"] for r in rows]


def test_the_generator_writes_none_of_its_questions():
    questions = {json.loads(line)["question"] for line in SET.read_text().splitlines()}
    generated = {p.question for split in ("train", "heldout")
                 for p in generate(3000, seed=7, split=split)}
    assert not questions & generated
