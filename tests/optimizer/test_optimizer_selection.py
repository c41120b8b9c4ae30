"""The optimiser's pure parts: which rollouts it learns from, the transcript it shows, what a
rewrite must be to count as a prompt, and the lineage tags every version carries."""

from __future__ import annotations

import json

import pytest

from optimizer.errors import OptimizerError
from optimizer.registry import format_ranges, lineage_tags
from optimizer.rollouts import Rollout, transcript_of, worst
from optimizer.search import clean, critique_prompt


def rollout(rid: str, reward: float, offset: int) -> Rollout:
    return Rollout(rid, reward, f"question {rid}", [{"role": "user", "content": f"q {rid}"},
                                                    {"role": "assistant", "content": "ANSWER: 1"}],
                   ("tt.rewards", offset % 2, offset))


def test_worst_takes_the_lowest_rewards_and_keeps_read_order_among_ties():
    rollouts = [rollout("a", 1.0, 0), rollout("b", 0.0, 1), rollout("c", 0.5, 2),
                rollout("d", 0.0, 3), rollout("e", -0.2, 4), rollout("f", 0.0, 5)]
    assert [r.rollout_id for r in worst(rollouts, 3)] == ["e", "b", "d"]
    assert [r.rollout_id for r in worst(rollouts, 10)] == ["e", "b", "d", "f", "c", "a"]
    with pytest.raises(OptimizerError, match="k=0"):
        worst(rollouts, 0)


def _llm_span(start: int, messages: list[dict], response: str) -> dict:
    return {"kind": "llm", "start_time_ns": start, "rollout_id": "r",
            "llm": {"request_messages": json.dumps(messages), "response_text": response}}


def test_transcript_starts_at_the_problem_and_ends_with_the_last_answer():
    system = {"role": "system", "content": "the prompt"}
    demo = [{"role": "user", "content": "demo q"}, {"role": "assistant", "content": "demo a"}]
    problem = {"role": "user", "content": "What is 2 + 3?"}
    first = [system, *demo, problem]
    second = [*first, {"role": "assistant", "content": "<tool>calc: 2+3</tool>"},
              {"role": "user", "content": "Result: 5"}]
    tool = {"kind": "tool", "start_time_ns": 2, "rollout_id": "r", "llm": None}
    # spans arrive out of order: the start time orders them
    question, transcript = transcript_of([_llm_span(3, second, "ANSWER: 6"), tool,
                                          _llm_span(1, first, "<tool>calc: 2+3</tool>")])
    assert question == "What is 2 + 3?"
    assert [m["content"] for m in transcript] == [
        "What is 2 + 3?", "<tool>calc: 2+3</tool>", "Result: 5", "ANSWER: 6"]
    assert transcript_of([tool]) is None
    assert transcript_of([_llm_span(1, [system], "x")]) is None  # no problem to show


def test_critique_shows_each_worst_rollout_with_its_reward():
    text = critique_prompt("the prompt", [rollout("a", 0.0, 0), rollout("b", 0.5, 1)])
    assert "the prompt" in text and "Problem: question a" in text
    assert "Reward: 0\n" in text and text.count("Assistant: ANSWER: 1") == 2


@pytest.mark.parametrize("raw, expected", [
    ('```\nSolve it exactly and end with ANSWER: <number>.\n```',
     "Solve it exactly and end with ANSWER: <number>."),
    ('New system prompt: "Use <tool>calc: EXPRESSION</tool> for sums."',
     "Use <tool>calc: EXPRESSION</tool> for sums."),
    ("   ", None), ("Too short.", None), ("x" * 1501, None),
])
def test_a_rewrite_counts_as_a_prompt_only_when_usable(raw, expected):
    assert clean(raw) == expected


def test_lineage_tags_name_score_parent_rollouts_and_offsets():
    learned = [rollout("r-1", 0.0, 7), rollout("r-2", 0.0, 8)]
    ranges = {"tt.spans": {1: (0, 40), 0: (10, 52)}, "tt.rewards": {0: (0, 9)}}
    tags = lineage_tags(score=0.0625, n_val=48, val_seed=5, parent=3, learned_from=learned,
                        ranges=ranges, role="candidate", critique="be exact")
    assert tags["score"] == "0.0625" and tags["parent_version"] == "3"
    assert tags["rollout_ids"] == "r-1,r-2" and tags["rollout_count"] == "2"
    assert tags["reward_offsets"] == "tt.rewards:1@7,tt.rewards:0@8"
    assert tags["topic_offsets"] == "tt.rewards:0=0-9;tt.spans:0=10-52,1=0-40"
    assert tags["role"] == "candidate" and tags["critique"] == "be exact"
    assert all(isinstance(v, str) for v in tags.values())  # MLflow takes string tags only
    seed = lineage_tags(score=1, n_val=48, val_seed=5, parent=None, learned_from=[],
                        ranges={}, role="seed")
    assert seed["parent_version"] == "" and seed["rollout_ids"] == ""


def test_long_lineage_is_cut_to_what_mlflow_keeps():
    learned = [rollout(f"rollout-{i:06d}", 0.0, i) for i in range(1000)]
    tags = lineage_tags(score=0, n_val=1, val_seed=1, parent=1, learned_from=learned,
                        ranges={}, role="candidate")
    assert len(tags["rollout_ids"]) == 5000 and tags["rollout_count"] == "1000"
    assert format_ranges({}) == ""
