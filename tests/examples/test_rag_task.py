"""The rag task's generator, retriever and reward, on the real corpus and the real bm25s."""

from __future__ import annotations

import re

import pytest

from examples.errors import ExamplesError
from examples.rag.corpus import Document, corpus
from examples.rag.phrasings import PHRASINGS, SPLITS
from examples.rag.questions import Hop, Question, generate, read_jsonl
from examples.rag.retrieval import Bm25Index, EmptyResult, RepeatedQuery, SearchTool, bm25_index
from examples.rag.reward import f1, format_score, reward, token_f1
from examples.rag.world import build

DOCS = {d.id: d for d in corpus()}


# -- generator ----------------------------------------------------------------------------------

def test_the_corpus_is_a_few_thousand_articles_with_unique_titles():
    docs = corpus()
    assert 2000 <= len(docs) <= 5000
    assert len({d.title.lower() for d in docs}) == len(docs)
    assert all(d.text.startswith(d.title) for d in docs)


def test_world_and_questions_are_deterministic_per_seed():
    assert build(0).entities == build(0).entities
    assert [e.name for e in build(1).entities.values()] != [e.name for e in build(0).entities.values()]
    for split in SPLITS:
        assert generate(40, 3, split=split) == generate(40, 3, split=split)
        assert generate(40, 3, split=split) != generate(40, 4, split=split)
    # the split is part of the seed: the same seed does not ask the same chains in both splits
    train, heldout = generate(40, 3), generate(40, 3, split="heldout")
    assert [q.supporting for q in train] != [q.supporting for q in heldout]


def test_questions_cycle_through_two_to_four_hops():
    assert [len(q.hops) for q in generate(9, 1, split="heldout")] == [2, 3, 4] * 3
    assert {len(q.hops) for q in generate(6, 1, hops=(3,))} == {3}


def _patterns(templates) -> list[re.Pattern]:
    return [re.compile(re.escape(t).replace(re.escape("{x}"), ".+"), re.IGNORECASE)
            for forms in templates for t in forms]


@pytest.mark.parametrize("split, other", [("heldout", "train"), ("train", "heldout")])
def test_a_split_never_uses_the_other_splits_templates(split, other):
    """Whole templates are held out, not only seeds: no question of one split reads as a
    question template of the other, nor contains one of its phrase templates."""
    for relation in PHRASINGS[split].phrases:
        assert not set(PHRASINGS[split].phrases[relation]) & set(PHRASINGS[other].phrases[relation])
    for relation in PHRASINGS[split].questions:
        assert not set(PHRASINGS[split].questions[relation]) & set(PHRASINGS[other].questions[relation])
    questions = _patterns(PHRASINGS[other].questions.values())
    phrases = _patterns(PHRASINGS[other].phrases.values())
    own = _patterns(PHRASINGS[split].questions.values())
    for q in generate(300, 5, split=split):
        assert any(p.fullmatch(q.question) for p in own)  # the check can see a template
        assert not any(p.fullmatch(q.question) for p in questions), q.question
        assert not any(p.search(q.question) for p in phrases), q.question


@pytest.mark.parametrize("split", SPLITS)
def test_the_gold_answer_is_reached_by_following_the_supporting_documents(split):
    for q in generate(200, 11, split=split):
        first = DOCS[q.hops[0].doc_id]
        assert first.title in q.question  # the chain starts at the entity the question names
        for hop, following in zip(q.hops, (*q.hops[1:], None), strict=True):
            doc = DOCS[hop.doc_id]
            assert hop.value in doc.text  # the document states the hop's fact
            if following is not None:     # ... which names the next document's entity
                assert DOCS[following.doc_id].title == hop.value
                assert hop.value not in q.question  # an intermediate answer is never given away
        assert q.hops[-1].value == q.answer
        assert len(set(q.supporting)) == len(q.hops)


@pytest.mark.parametrize("kwargs, named", [
    ({"n": -1, "seed": 1}, "n=-1"),
    ({"n": 3, "seed": 1, "split": "dev"}, "'dev'"),
    ({"n": 3, "seed": 1, "hops": (5,)}, "(5,)"),
    ({"n": 3, "seed": 1, "hops": ()}, "()"),
])
def test_bad_generator_arguments_are_named(kwargs, named):
    with pytest.raises(ExamplesError, match=re.escape(named)):
        generate(**kwargs)


def test_questions_read_from_jsonl(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "Who?", "answer": "Bo", "supporting": ["e0001"]}\n\n'
                    '{"question": "When?", "answer": 1901}\n')
    assert read_jsonl(path) == [Question("Who?", "Bo", (Hop("e0001", "", ""),)),
                                Question("When?", "1901")]
    path.write_text('{"question": "Who?"}\n')
    with pytest.raises(ExamplesError, match="q.jsonl:1"):
        read_jsonl(path)


# -- retrieval ----------------------------------------------------------------------------------

SMALL = [Document("a", "Ivo Drane", "Ivo Drane is a pilot born in Tarsk. He works for Molt Labs."),
         Document("b", "Tarsk", "Tarsk is a city in Velm. The mayor of Tarsk is Ada Quill."),
         Document("c", "Molt Labs", "Molt Labs is a company founded by Ada Quill in 1950."),
         Document("d", "Velm", "Velm is a country whose capital is Tarsk."),
         Document("e", "Ada Quill", "Ada Quill is a baker born in Orrin. She works for Molt Labs.")]


def test_bm25_ranks_the_article_about_the_asked_fact_first():
    index = Bm25Index(SMALL)
    assert [d.id for d in index.search("Molt Labs founded", k=1)] == ["c"]
    assert index.search("mayor of Tarsk", k=2)[0].id == "b"
    assert index.search("Ada Quill born", k=1)[0].id == "e"
    # only documents sharing a word with the query: none, for words the corpus lacks
    assert index.search("zeppelin quartz", k=3) == []
    assert index.search("the of", k=3) == []  # stop words only
    assert {d.id for d in index.search("Velm", k=5)} == {"b", "d"}


def test_bm25_finds_each_hops_document_on_the_corpus():
    """Recall@3 of the hop a decomposed question asks (entity name + relation words)."""
    words = {"born_in": "born", "works_for": "works for", "birth_year": "born", "in_country": "city in",
             "mayor": "mayor", "capital": "capital", "currency": "currency", "founder": "founded by",
             "headquarters": "headquartered", "founded": "founded", "singer": "lead singer",
             "label": "record label", "author": "written by", "publisher": "published by"}
    index, hits, total = bm25_index(), 0, 0
    for q in generate(100, 2, split="heldout"):
        for hop in q.hops:
            found = index.search(f"{DOCS[hop.doc_id].title} {words[hop.relation]}", k=3)
            hits += hop.doc_id in {d.id for d in found}
            total += 1
    assert hits / total >= 0.95


def test_the_search_tool_refuses_empty_results_and_repeated_queries():
    search = SearchTool(Bm25Index(SMALL), k=2)
    first = search("Molt Labs founder")
    assert first.startswith("1. Molt Labs is a company founded by Ada Quill")
    assert first.count("\n") == 1  # two documents, one per line
    with pytest.raises(RepeatedQuery, match="'founder Molt Labs' was already searched"):
        search("founder Molt Labs")  # the same words in another order
    with pytest.raises(EmptyResult, match="no document matches 'zeppelin'"):
        search("zeppelin")
    with pytest.raises(RepeatedQuery):
        search("Zeppelin")  # an empty search asked again is a repeat too
    assert search("Ada Quill born").startswith("1. Ada Quill is a baker")
    # the ids of what the two successful searches returned, best first
    assert len(search.found) == 4 and search.found[0] == "c" and search.found[2] == "e"


# -- reward ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, gold, fmt, f1_value", [
    ("ANSWER: Elmcaster", "Elmcaster", 1.0, 1.0),
    ("ANSWER: elmcaster.", "Elmcaster", 1.0, 1.0),                # case and punctuation
    ("ANSWER: the city of Elmcaster", "Elmcaster", 1.0, 0.5),     # P 1/3 (the: article), R 1
    ("ANSWER: Buliox", "Bryn Buliox", 1.0, 2 / 3),                # P 1, R 1/2
    ("ANSWER: Paris", "Elmcaster", 1.0, 0.0),
    ("Elmcaster", "Elmcaster", 0.0, 0.0),                         # no ANSWER line: no credit
    ("ANSWER:", "Elmcaster", 0.0, 0.0),
    ("ANSWER: Paris\nANSWER: 1954", "1954", 1.0, 1.0),            # the last answer counts
])
def test_reward_is_format_plus_token_f1(text, gold, fmt, f1_value):
    assert format_score(text) == fmt
    assert f1(text, gold) == pytest.approx(f1_value)
    assert reward(text, gold) == pytest.approx(0.1 * fmt + 0.9 * f1_value)


def test_token_f1_counts_repeated_tokens_once_each():
    # prediction "bo bo lin" vs gold "bo lin": common 2, P 2/3, R 1, F1 0.8
    assert token_f1("Bo Bo Lin", "Bo Lin") == pytest.approx(0.8)
    assert token_f1("", "Bo") == 0.0
