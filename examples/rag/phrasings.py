"""The words of the rag task's multi-hop questions (examples/rag/questions.py composes them),
split into what training traffic sees and what the held-out set alone uses, as calc's
phrasings are (examples/calc/phrasings.py).

A question follows a chain of relations from a named entity: each inner hop is a noun phrase
over the one before (`the founder of {x}`, then `the city where {x} was born`), the last hop is
a question over the phrase (`In which country is {x}?`). Every relation has noun-phrase forms
and question forms in each split, and no form belongs to both, so a held-out question shares
no template with training traffic, only the corpus and the relations.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Phrasings:
    phrases: dict[str, tuple[str, ...]]    # relation -> noun phrases over {x}
    questions: dict[str, tuple[str, ...]]  # relation -> questions over {x}


PHRASINGS = {
    "train": Phrasings(
        phrases={
            "born_in": ("the city where {x} was born", "the birthplace of {x}"),
            "works_for": ("the company {x} works for", "the employer of {x}"),
            "in_country": ("the country that {x} is in",),
            "mayor": ("the mayor of {x}",),
            "capital": ("the capital of {x}",),
            "founder": ("the founder of {x}", "the person who founded {x}"),
            "headquarters": ("the city where {x} is headquartered",),
            "singer": ("the lead singer of {x}",),
            "label": ("the record label of {x}",),
            "author": ("the author of {x}", "the writer of {x}"),
            "publisher": ("the publisher of {x}",),
        },
        questions={
            "born_in": ("In which city was {x} born?",),
            "works_for": ("Which company does {x} work for?",),
            "birth_year": ("In which year was {x} born?",),
            "in_country": ("In which country is {x}?",),
            "mayor": ("Who is the mayor of {x}?",),
            "capital": ("What is the capital of {x}?",),
            "currency": ("What is the currency of {x}?",),
            "founder": ("Who founded {x}?",),
            "headquarters": ("Where is {x} headquartered?",),
            "founded": ("In which year was {x} founded?",),
            "singer": ("Who is the lead singer of {x}?",),
            "label": ("Which record label is {x} signed to?",),
            "author": ("Who wrote {x}?",),
            "publisher": ("Who published {x}?",),
        },
    ),
    "heldout": Phrasings(
        phrases={
            "born_in": ("the home town of {x}",),
            "works_for": ("the firm that employs {x}",),
            "in_country": ("the nation that contains {x}",),
            "mayor": ("the person serving as mayor of {x}",),
            "capital": ("the capital city of {x}",),
            "founder": ("the person who started {x}",),
            "headquarters": ("the city hosting the head office of {x}",),
            "singer": ("the vocalist fronting {x}",),
            "label": ("the label that signed {x}",),
            "author": ("the person who wrote {x}",),
            "publisher": ("the company that published {x}",),
        },
        questions={
            "born_in": ("Name the city {x} was born in.",),
            "works_for": ("Name the firm that employs {x}.",),
            "birth_year": ("What is the birth year of {x}?",),
            "in_country": ("Name the nation that {x} lies in.",),
            "mayor": ("Name the person serving as mayor of {x}.",),
            "capital": ("Name the capital city of {x}.",),
            "currency": ("Which currency is used in {x}?",),
            "founder": ("Name the person who started {x}.",),
            "headquarters": ("Name the city hosting the head office of {x}.",),
            "founded": ("When was {x} established?",),
            "singer": ("Name the vocalist fronting {x}.",),
            "label": ("Name the label that signed {x}.",),
            "author": ("Name the person who wrote {x}.",),
            "publisher": ("Name the company that published {x}.",),
        },
    ),
}
SPLITS = tuple(PHRASINGS)
