"""The rag task's reward, as in the Agent Lightning paper's RAG task: a format score plus the
token F1 of the answer against the gold answer (SQuAD's normalisation: lower case, no
punctuation, no articles).

    reward = 0.1 * format_score + 0.9 * F1

The weights are ours (the paper adds the two without printing its weights): the format part
only steers the policy towards a parsable last line, the answer's content carries the rest.
An episode without an `ANSWER:` line scores 0 on both.
"""

from __future__ import annotations

import collections
import re
import string

FORMAT_WEIGHT, F1_WEIGHT = 0.1, 0.9
_ANSWER_RE = re.compile(r"ANSWER:\s*(.*\S)", re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def final_answer(text: str) -> str | None:
    """The text after the last `ANSWER:`, or None without one (or with nothing after it)."""
    matches = _ANSWER_RE.findall(text or "")
    return matches[-1].strip() if matches else None


def tokens(text: str) -> list[str]:
    return _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split()


def token_f1(prediction: str, gold: str) -> float:
    predicted, wanted = tokens(prediction), tokens(gold)
    common = sum((collections.Counter(predicted) & collections.Counter(wanted)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def format_score(text: str) -> float:
    return 0.0 if final_answer(text) is None else 1.0


def f1(text: str, gold: str) -> float:
    answer = final_answer(text)
    return 0.0 if answer is None else token_f1(answer, gold)


def reward(text: str, gold: str) -> float:
    return FORMAT_WEIGHT * format_score(text) + F1_WEIGHT * f1(text, gold)
