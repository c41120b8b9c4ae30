"""The rag task's document corpus: one short article per entity of the seeded world
(examples/rag/world.py), generated on first use and kept for the process (a few thousand
articles take well under a second; nothing is downloaded or shipped).

    docs = corpus()                 # the default world's articles, cached
    docs[0].id, docs[0].title, docs[0].text

An article states every fact of its entity (one sentence per relation) and mentions the names
of the entities it relates to, so a name retrieves its own article and the articles that
mention it: the retriever has to rank, not only match.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from examples.rag.world import Entity, World, build

CORPUS_SEED = 0  # the one world both splits' questions are about (as MuSiQue's Wikipedia)

_ARTICLES = {
    "person": "{name} is a {occupation} born in {born_in} in {birth_year}. {pronoun} works for "
              "{works_for}.",
    "city": "{name} is a city in {in_country}, on the river {river}. The mayor of {name} is "
            "{mayor}.",
    "country": "{name} is a country whose capital is {capital}. The currency of {name} is the "
               "{currency}.",
    "company": "{name} is a company founded by {founder} in {founded}. {name} is headquartered "
               "in {headquarters}.",
    "band": "{name} are a band whose lead singer is {singer}. The band is signed to the record "
            "label {label}.",
    "book": "{name} is a novel written by {author}. It was published by {publisher}.",
}


@dataclass(frozen=True)
class Document:
    id: str       # the entity's id: a question's supporting documents name it
    title: str
    text: str


def article(world: World, entity: Entity) -> Document:
    words = {relation: world.value(entity, relation) for relation in entity.facts}
    text = _ARTICLES[entity.kind].format(name=entity.name, **words, **entity.extra)
    return Document(entity.id, entity.name, text)


@functools.lru_cache(maxsize=4)
def world(seed: int = CORPUS_SEED) -> World:
    return build(seed)


@functools.lru_cache(maxsize=4)
def corpus(seed: int = CORPUS_SEED) -> tuple[Document, ...]:
    built = world(seed)
    return tuple(article(built, entity) for entity in built.entities.values())
