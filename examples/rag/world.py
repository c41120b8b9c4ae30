"""A seeded world of made-up entities and their relations, the facts behind the rag corpus.

    world = build(seed=0)
    world.entities["e0042"].facts["born_in"]     # "e0317" (an entity id) or "1954" (a value)

Six kinds of entity (people, cities, countries, companies, bands, novels), each with one
value per relation (examples/rag/phrasings.py names the relations): functional relations, so
a chain of them from a named entity has exactly one answer. Names are invented from
syllables, so the policy cannot know a fact without retrieving it, and unique, so a name in a
question picks one article. The same seed gives the same world.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# How many entities of each kind: about 3,300 articles, a few thousand as in the issue
COUNTS = {"person": 1500, "city": 400, "country": 40, "company": 600, "band": 300, "book": 450}
# relation -> kind of its object ("year"/"currency": a plain value, only the last hop asks it)
RELATIONS = {
    "person": {"born_in": "city", "works_for": "company", "birth_year": "year"},
    "city": {"in_country": "country", "mayor": "person"},
    "country": {"capital": "city", "currency": "currency"},
    "company": {"founder": "person", "headquarters": "city", "founded": "year"},
    "band": {"singer": "person", "label": "company"},
    "book": {"author": "person", "publisher": "company"},
}
VALUE_KINDS = ("year", "currency")
OCCUPATIONS = ("painter", "engineer", "chemist", "novelist", "pilot", "architect", "farmer",
               "teacher", "surgeon", "sailor", "composer", "lawyer", "baker", "historian")
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
           "gr", "kr", "pl", "st", "tr", "th", "sh", "qu")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y")
_CODAS = ("", "", "n", "r", "l", "s", "th", "nd", "rk", "x", "m")
_SUFFIXES = {"city": ("", "ford", "holm", "ton", "via", "burg", "mouth"),
             "country": ("ia", "land", "mark", "ora"),
             "company": (" Labs", " Works", " Holdings", " Motors", " Foods", " Textiles",
                         " Shipping", " Systems")}
_NOUNS = ("Lantern", "River", "Silence", "Harvest", "Mirror", "Orchard", "Tide", "Ember", "Crown",
          "Garden", "Winter", "Compass", "Glass", "Thread", "Salt", "Feather")


@dataclass
class Entity:
    id: str
    kind: str
    name: str
    facts: dict[str, str] = field(default_factory=dict)  # relation -> entity id or value
    extra: dict[str, str] = field(default_factory=dict)  # words of the article, no relation


@dataclass
class World:
    seed: int
    entities: dict[str, Entity]

    def of_kind(self, kind: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind]

    def value(self, entity: Entity, relation: str) -> str:
        """The object of `relation` as text: an entity's name, or the value itself."""
        target = entity.facts[relation]
        return self.entities[target].name if target in self.entities else target


def _word(rng: random.Random, syllables: int) -> str:
    text = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
    return (text + rng.choice(_CODAS)).capitalize()


def _name(rng: random.Random, kind: str) -> str:
    if kind == "person":
        return f"{_word(rng, rng.randint(1, 2))} {_word(rng, 2)}"
    if kind == "band":
        return f"The {_word(rng, 2)}s"
    if kind == "book":
        return f"The {rng.choice(_NOUNS)} of {_word(rng, 2)}"
    return _word(rng, rng.randint(1, 2)) + rng.choice(_SUFFIXES[kind])


def _entities(rng: random.Random) -> dict[str, Entity]:
    used: set[str] = set()
    entities: dict[str, Entity] = {}
    for kind, count in COUNTS.items():
        for _ in range(count):
            name = _name(rng, kind)
            while name in used or name.lower() in used:
                name = _name(rng, kind)
            used.update((name, name.lower()))
            eid = f"e{len(entities):04d}"
            entities[eid] = Entity(eid, kind, name)
    return entities


def _relate(rng: random.Random, world: World) -> None:
    ids = {kind: [e.id for e in world.of_kind(kind)] for kind in COUNTS}
    currencies = sorted({_word(rng, 2).lower() for _ in range(3 * COUNTS["country"])})
    # a country's capital lies in it, and no two cities share a mayor
    cities = list(ids["city"])
    rng.shuffle(cities)
    for i, city in enumerate(cities):
        world.entities[city].facts["in_country"] = ids["country"][i % len(ids["country"])]
    for i, country in enumerate(ids["country"]):
        world.entities[country].facts["capital"] = cities[i]
    for city, mayor in zip(ids["city"], rng.sample(ids["person"], len(ids["city"])), strict=True):
        world.entities[city].facts["mayor"] = mayor
    for entity in world.entities.values():
        for relation, target in RELATIONS[entity.kind].items():
            if relation in entity.facts:
                continue
            if target == "year":
                low = 1900 if relation == "birth_year" else 1820
                entity.facts[relation] = str(rng.randint(low, 2005))
            elif target == "currency":
                entity.facts[relation] = rng.choice(currencies)
            else:
                entity.facts[relation] = rng.choice(ids[target])
        if entity.kind == "person":
            entity.extra = {"occupation": rng.choice(OCCUPATIONS),
                            "pronoun": rng.choice(("He", "She"))}
        elif entity.kind == "city":
            entity.extra = {"river": _word(rng, 2)}


def build(seed: int = 0) -> World:
    rng = random.Random(f"rag-world:{seed}")
    world = World(seed, _entities(rng))
    _relate(rng, world)
    return world
