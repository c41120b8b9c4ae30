"""Recall@5 of the rag task's retrievers on the gold supporting documents.

    .venv/bin/python -m bench.rag_retrieval [--n 300] [--no-dense]

Two recalls per retriever, over held-out questions (examples/rag/questions.py):
- `question`: the question itself as the query (MuSiQue's retrieval recall): the share of a
  question's supporting documents among the top 5. Only the first hop's entity is named in a
  multi-hop question, so this is low by construction;
- `hop`: one query per hop as an agent that decomposed the question would ask (the hop's
  entity name and its relation's words), hit when that hop's document is in the top 5.
Dense retrieval (all-MiniLM-L6-v2, the `rag-dense` extra) is measured when it is installed.
Prints one JSON line per retriever, then one JSON line last with all the figures.
"""

from __future__ import annotations

import argparse
import json
import time

from examples.errors import ExamplesError
from examples.rag.corpus import corpus, world
from examples.rag.questions import generate
from examples.rag.retrieval import Bm25Index, DenseIndex

K = 5
# the words an agent would add to an entity's name to ask for one relation
RELATION_WORDS = {"born_in": "born", "works_for": "works for", "birth_year": "born",
                  "in_country": "country", "mayor": "mayor", "capital": "capital",
                  "currency": "currency", "founder": "founded by", "headquarters": "headquartered",
                  "founded": "founded", "singer": "lead singer", "label": "record label",
                  "author": "written by", "publisher": "published by"}


def recalls(index, questions) -> dict:
    built = world()
    question_hits = question_total = hop_hits = hop_total = 0
    started = time.perf_counter()
    for q in questions:
        top = {d.id for d in index.search(q.question, K)}
        question_hits += len(top & set(q.supporting))
        question_total += len(q.supporting)
        for hop in q.hops:
            query = f"{built.entities[hop.doc_id].name} {RELATION_WORDS[hop.relation]}"
            hop_hits += hop.doc_id in {d.id for d in index.search(query, K)}
            hop_total += 1
    queries = len(questions) + hop_total
    return {"retriever": index.name, "recall_at_5_question": round(question_hits / question_total, 4),
            "recall_at_5_hop": round(hop_hits / hop_total, 4),
            "ms_per_query": round(1000 * (time.perf_counter() - started) / queries, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="held-out questions")
    parser.add_argument("--no-dense", action="store_true", help="measure BM25 only")
    args = parser.parse_args()
    docs, questions = corpus(), generate(args.n, seed=7, split="heldout")
    builders = [Bm25Index] if args.no_dense else [Bm25Index, DenseIndex]
    results = {"docs": len(docs), "questions": len(questions)}
    for build in builders:
        started = time.perf_counter()
        try:
            index = build(docs)
        except (ImportError, ExamplesError) as exc:  # the rag-dense extra is not installed
            results[f"{build.name}_skipped"] = str(exc)
            continue
        figures = recalls(index, questions)
        figures["index_s"] = round(time.perf_counter() - started, 2)
        print(json.dumps(figures), flush=True)
        results[build.name] = {k: v for k, v in figures.items() if k != "retriever"}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
