"""Seeded multi-hop questions (2 to 4 hops) over the rag corpus, with gold answers and the
supporting documents, after MuSiQue (the Agent Lightning paper's RAG task).

    from examples.rag.questions import generate
    train = generate(n=200, seed=1)                     # training traffic's phrasings
    heldout = generate(n=200, seed=1, split="heldout")  # question templates never trained on

A question walks functional relations from a named entity (examples/rag/world.py), so its
answer is unique; `hops` lists, per hop, the document that states the fact and the fact's
value, which names the next hop's entity: following the supporting documents in order gives
the answer (the tests check it). The `train` and `heldout` splits share no phrase or question
template (examples/rag/phrasings.py) and draw from differently seeded generators; the same
(n, seed, hops, split) gives the same questions.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from examples.errors import ExamplesError
from examples.rag.corpus import CORPUS_SEED, world
from examples.rag.phrasings import PHRASINGS, SPLITS
from examples.rag.world import RELATIONS, VALUE_KINDS, Entity, World

HOPS = (2, 3, 4)


@dataclass(frozen=True)
class Hop:
    doc_id: str     # the document stating the fact
    relation: str
    value: str      # the fact's object as the document words it


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    hops: tuple[Hop, ...] = ()

    @property
    def supporting(self) -> tuple[str, ...]:
        return tuple(hop.doc_id for hop in self.hops)


def _walk(rng: random.Random, built: World, n_hops: int) -> list[tuple[Entity, str]] | None:
    """(subject, relation) per hop from a random entity, never revisiting one; None when the
    walk gets stuck (the caller draws again)."""
    entity = rng.choice(list(built.entities.values()))
    seen, path = {entity.id}, []
    for hop in range(n_hops):
        last = hop == n_hops - 1
        options = [r for r, kind in RELATIONS[entity.kind].items()
                   if (last or kind not in VALUE_KINDS) and entity.facts[r] not in seen]
        if not options:
            return None
        relation = rng.choice(options)
        path.append((entity, relation))
        target = entity.facts[relation]
        if not last:
            entity = built.entities[target]
            seen.add(target)
    return path


def _question(rng: random.Random, built: World, n_hops: int, split: str) -> Question:
    phrasings = PHRASINGS[split]
    path = None
    while path is None:
        path = _walk(rng, built, n_hops)
    text = path[0][0].name
    for _, relation in path[:-1]:
        text = rng.choice(phrasings.phrases[relation]).format(x=text)
    last_subject, last_relation = path[-1]
    question = rng.choice(phrasings.questions[last_relation]).format(x=text)
    hops = tuple(Hop(subject.id, relation, built.value(subject, relation))
                 for subject, relation in path)
    return Question(question[0].upper() + question[1:], built.value(last_subject, last_relation), hops)


def generate(n: int, seed: int, hops: tuple[int, ...] = HOPS, split: str = "train",
             corpus_seed: int = CORPUS_SEED) -> list[Question]:
    """`n` questions cycling through `hops` (chain lengths), deterministic for `seed`, in the
    phrasings of `split` (`train` for traffic, `heldout` for evaluation)."""
    if n < 0:
        raise ExamplesError(f"n={n}: expected a count >= 0")
    if not hops or set(hops) - set(HOPS):
        raise ExamplesError(f"hops {hops}: expected values among {', '.join(map(str, HOPS))}")
    if split not in SPLITS:
        raise ExamplesError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    rng = random.Random(f"rag:{split}:{seed}")
    built = world(corpus_seed)
    return [_question(rng, built, hops[i % len(hops)], split) for i in range(n)]


def read_jsonl(path: Path) -> list[Question]:
    """Questions from JSONL lines {"question": ..., "answer": ...} (supporting docs optional:
    {"supporting": [doc ids]})."""
    questions = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise ExamplesError(f"{path}:{number}: expected {{\"question\": ..., \"answer\": ...}}")
        hops = tuple(Hop(doc, "", "") for doc in row.get("supporting", ()))
        questions.append(Question(str(row["question"]), str(row["answer"]), hops))
    return questions
