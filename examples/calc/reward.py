"""The calc task's reward: 1 for an exactly correct final answer, else 0."""

from __future__ import annotations

import re

# The agent is asked to end with "ANSWER: <number>"; the last such line counts.
_ANSWER_RE = re.compile(r"ANSWER:\s*(-?[\d,]*\.?\d+)", re.IGNORECASE)


def final_answer(text: str) -> str | None:
    matches = _ANSWER_RE.findall(text or "")
    return matches[-1].replace(",", "") if matches else None


def reward(text: str, answer: int) -> float:
    got = final_answer(text)
    if got is None:
        return 0.0
    try:
        return 1.0 if float(got) == float(answer) else 0.0
    except ValueError:
        return 0.0
