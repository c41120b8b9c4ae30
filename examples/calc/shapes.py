"""Word problems of other shapes than one running quantity (examples/calc/problems.py mixes them
in with its chain stories): change from a payment, a total of two related parts, what is left of a
whole after two parts, items packed into boxes, a rate plus an extra, a comparison of two people,
... Each is one to three operations whose expression is the plain reading of its words, such as
`50 - 7 * 4` for "buys 7 pens at 4 dollars each and pays with 50 dollars: the change?".

    from examples.calc.shapes import SHAPES, shapes
    shapes("train", ops=2)        # the shapes that training traffic tells with two operations

A Shape has a name, a `draw` that picks its numbers (so that every division is exact and the
answer is a whole number >= 0) and returns them with the answer worked out from how they were
drawn, an `expression` over those numbers (`str.format`; `calculator.evaluate` gives the
answer, which the tests check), and whole problems (story and question) as `str.format`
templates per split, over the numbers, `{who}` with its pronouns (`{he} {He} {him} {his} {His}
{self}`), `{other}` (a second name) and `{times}`/`{nth}` for `{n}` in words (as in
examples/calc/phrasings.py).

Held out as the project's evaluation requires: some shapes have held-out templates only (whole
kinds of problem never trained on: HELDOUT_ONLY), and a shape told in both splits is told with
other scenarios, wording and questions in each, so no sentence is shared.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

_NOTES = (10, 20, 50, 100, 200, 500)  # a payment is the first or second of these above the cost


@dataclass(frozen=True)
class Shape:
    name: str
    expression: str                                    # over the drawn numbers
    draw: Callable[[random.Random], tuple[dict, int]]  # (numbers, answer)
    templates: dict[str, tuple[str, ...]]              # split -> whole problems

    @property
    def ops(self) -> int:
        return len(re.findall(r"[-+*/]", self.expression))


def _payment(rng: random.Random, cost: int) -> int:
    return rng.choice([note for note in _NOTES if note > cost][:2])


def _difference(rng):
    a = rng.randint(20, 400)
    b = rng.randint(3, a - 3)
    return {"a": a, "b": b}, a - b


def _more_than(rng):
    a, b = rng.randint(10, 300), rng.randint(2, 150)
    return {"a": a, "b": b}, a + b


def _compare_total(rng):
    a, b = rng.randint(10, 300), rng.randint(2, 150)
    return {"a": a, "b": b}, a + (a + b)


def _change(rng):
    a, b = rng.randint(2, 9), rng.randint(2, 40)
    c = _payment(rng, a * b)
    return {"a": a, "b": b, "c": c}, c - a * b


def _groups_used(rng):
    a, b, left = rng.randint(2, 12), rng.randint(2, 25), rng.randint(1, 150)
    return {"a": a, "b": b, "c": a * b + left}, left


def _times_as_many(rng):
    a, n = rng.randint(8, 150), rng.randint(2, 6)
    return {"a": a, "n": n}, a * (1 + n)


def _packing(rng):
    n, boxes = rng.randint(2, 12), rng.randint(2, 40)
    a = rng.randint(2, n * boxes - 2)
    return {"a": a, "b": n * boxes - a, "n": n}, boxes


def _parts_of_whole(rng):
    a, b, left = rng.randint(5, 200), rng.randint(5, 200), rng.randint(1, 200)
    return {"a": a, "b": b, "c": a + b + left}, left


def _rate_plus_extra(rng):
    a, b, c = rng.randint(2, 40), rng.randint(2, 12), rng.randint(2, 150)
    return {"a": a, "b": b, "c": c}, a * b + c


def _share_then_more(rng):
    n, each, d = rng.randint(2, 12), rng.randint(2, 60), rng.randint(2, 30)
    return {"c": n * each, "n": n, "d": d}, each + d


def _change_with_fee(rng):
    a, b, d = rng.randint(2, 8), rng.randint(2, 30), rng.randint(2, 30)
    c = _payment(rng, a * b + d)
    return {"a": a, "b": b, "c": c, "d": d}, c - a * b - d


def _leftover_shared(rng):
    a, b, n, each = rng.randint(2, 9), rng.randint(2, 20), rng.randint(2, 9), rng.randint(2, 30)
    return {"a": a, "b": b, "c": a * b + n * each, "n": n}, each


def _two_purchases(rng):
    a, b, c, d = rng.randint(2, 9), rng.randint(2, 40), rng.randint(2, 9), rng.randint(2, 40)
    return {"a": a, "b": b, "c": c, "d": d}, a * b + c * d


SHAPES = (
    Shape("difference", "{a} - {b}", _difference, {
        "train": (
            "{who} has {a} stickers and {other} has {b}. How many more stickers does {who} have "
            "than {other}?",
            "{who} read {a} pages this month; {other} read {b} pages. How many more pages did "
            "{who} read?",
            "A red box holds {a} buttons and a blue box holds {b} buttons. How many fewer buttons "
            "are in the blue box than in the red one?",
            "{who} folded {a} paper cranes and {other} folded {b}. How many fewer cranes did "
            "{other} fold?",
            "A jar of red beans holds {a} beans, and a jar of white beans holds {b}. How many "
            "more red beans are there than white ones?"),
        "heldout": (
            "{who} scored {a} points in a quiz, and {other} scored {b}. By how many points did "
            "{who} beat {other}?",
            "The north field has {a} sheep and the south field has {b}. How many more sheep "
            "graze in the north field?"),
    }),
    Shape("more than", "{a} + {b}", _more_than, {
        "train": (
            "{other} has {a} marbles. {who} has {b} more marbles than {other}. How many marbles "
            "does {who} have?",
            "The green team scored {a} points, and the yellow team scored {b} more points than "
            "the green team. How many points did the yellow team score?",
            "A bakery made {a} loaves on Friday. On Saturday it made {b} more loaves than on "
            "Friday. How many loaves did it make on Saturday?",
            "A small candle burns for {a} minutes. A big candle burns {b} minutes longer than "
            "that. For how many minutes does the big candle burn?",
            "{who}'s comic collection is {b} comics bigger than {other}'s, which has {a}. How "
            "many comics does {who} own?"),
        "heldout": (
            "{other}'s kite string is {a} metres long, and {who}'s is {b} metres longer. What is "
            "the length of {who}'s kite string in metres?",
            "A new bridge is {b} metres longer than the old one, which is {a} metres long. How "
            "long is the new bridge, in metres?"),
    }),
    Shape("change", "{c} - {a} * {b}", _change, {
        "train": (
            "{who} buys {a} notebooks at {b} dollars each and pays with {c} dollars. How much "
            "change does {he} get, in dollars?",
            "{who} orders {a} pizzas that cost {b} euros each. {He} hands over {c} euros. How "
            "many euros should {he} get back?",
            "At the fair, {who} buys {a} tickets for {b} pounds apiece. {He} pays with {c} "
            "pounds. Work out {his} change in pounds.",
            "{who} wants {a} bowls of noodles at {b} euros a bowl and gives the waiter {c} euros. "
            "How many euros does the waiter bring back?"),
        "heldout": (
            "{who} picks up {a} bags of flour priced at {b} dollars a bag and gives the cashier "
            "{c} dollars. What change is {he} owed, in dollars?",
            "{who} takes {c} euros to the bike shop and buys {a} inner tubes costing {b} euros "
            "each. How many euros does {he} come home with?"),
    }),
    Shape("groups used", "{c} - {a} * {b}", _groups_used, {
        "train": (
            "{who} has {c} beads and uses {a} strings of {b} beads each to make bracelets. How "
            "many beads does {he} have left?",
            "A roll holds {c} stickers. {who} uses {a} rows of {b} stickers to decorate {his} "
            "notebooks. How many stickers remain on the roll?",
            "There are {c} chairs in the hall. {who} sets out {a} rows of {b} chairs for a "
            "concert and leaves the rest stacked. How many chairs stay stacked?",
            "A ball of wool is {c} metres long. {who} cuts {a} pieces of {b} metres each from it. "
            "How many metres of wool are left on the ball?"),
        "heldout": (
            "A baker has {c} eggs and bakes {a} cakes, each needing {b} eggs. How many eggs are "
            "not used?",
            "{who}'s printer has {c} sheets of paper in it. {He} prints {a} copies of a {b}-page "
            "report, one page per sheet. How many sheets are still in the printer?"),
    }),
    Shape("times as many", "{a} + {a} * {n}", _times_as_many, {
        "train": (
            "{who} picked {a} apples on Monday and {times} as many on Tuesday. How many apples "
            "did {he} pick over the two days?",
            "A café sold {a} cups of tea in the morning and {n} times as many in the afternoon. "
            "How many cups of tea did it sell in all that day?",
            "{who}'s first album has {a} songs, and {his} second has {times} as many. How many "
            "songs are on the two albums together?",
            "A snail crawls {a} centimetres in the morning and {times} as far in the afternoon. "
            "How many centimetres does it crawl that day?"),
        "heldout": (
            "A school's first bus trip carried {a} pupils, and its second carried {n} times that "
            "number. Altogether, how many pupils went on the two trips?",
            "In week one {who} ran {a} kilometres; in week two {he} ran {times} that distance. "
            "What distance in kilometres did {he} run across both weeks?"),
    }),
    Shape("packing", "({a} + {b}) / {n}", _packing, {
        "train": (
            "{who} has {a} red pencils and {b} blue pencils. {He} packs them all into boxes of "
            "{n}, and every box is full. How many boxes does {he} fill?",
            "A farm collects {a} eggs in the morning and {b} eggs in the afternoon. The eggs go "
            "into full cartons of {n}. How many cartons are needed?",
            "{a} girls and {b} boys go on a school trip and are split into groups of {n}. How "
            "many groups are there?",
            "{who} collects {a} bottle caps and {other} collects {b}. They glue all the caps onto "
            "boards, {n} to a board, with none left over. How many boards do they fill?"),
        "heldout": (
            "{who} bakes {a} chocolate cookies and {b} oat cookies, then wraps them in bags of "
            "{n} with none left over. How many bags does {he} wrap?",
            "{a} adults and {b} children take a river tour on rafts that each carry {n} people, "
            "and every raft is full. Determine the number of rafts used."),
    }),
    Shape("parts of a whole", "{c} - {a} - {b}", _parts_of_whole, {
        "train": (
            "A mosaic needs {c} tiles. {who} sets {a} of them and {other} sets {b}. How many "
            "tiles are still to be set?",
            "{who} and {other} must deliver {c} leaflets. {who} delivers {a} and {other} "
            "delivers {b}. How many leaflets are left to deliver?",
            "A class is reading a book of {c} pages. It read {a} pages last week and {b} pages "
            "this week. How many pages are left to read?",
            "A cake recipe needs {c} grams of flour. {who} has weighed out {a} grams, and {other} "
            "adds {b} grams. How many grams are still missing?"),
        "heldout": (
            "A wall needs {c} bricks. {who} lays {a} bricks and {other} lays {b}. How many more "
            "bricks must be laid to finish the wall?",
            "Of the {c} tickets for a show, {a} are sold online and {b} at the door. Figure out "
            "how many tickets are unsold."),
    }),
    Shape("rate plus extra", "{a} * {b} + {c}", _rate_plus_extra, {
        "train": (
            "{who} reads {a} pages a day for {b} days and then {c} more pages on Sunday. How "
            "many pages does {he} read in all?",
            "A machine fills {a} bottles a minute. It runs for {b} minutes, and then a worker "
            "fills {c} more bottles by hand. How many bottles are filled altogether?",
            "{who} earns {a} dollars an hour for {b} hours, plus a tip of {c} dollars. How many "
            "dollars does {he} earn in total?",
            "{who} swims {a} lengths a day for {b} days and {c} extra lengths at the weekend. How "
            "many lengths does {he} swim over the whole time?"),
        "heldout": (
            "{who} saves {a} euros every week for {b} weeks, and {his} aunt adds a gift of {c} "
            "euros. How many euros has {he} put aside, the gift included?",
            "A printer turns out {a} posters per hour for {b} hours and another {c} posters the "
            "next morning. What is the number of posters it has printed?"),
    }),
    Shape("change with a fee", "{c} - {a} * {b} - {d}", _change_with_fee, {
        "train": (
            "{who} buys {a} sandwiches at {b} dollars each and a drink for {d} dollars. {He} pays "
            "with {c} dollars. How much change does {he} get, in dollars?",
            "{who} has {c} euros. {He} buys {a} plants for {b} euros each and pays {d} euros for "
            "delivery. How many euros does {he} have left?",
            "{who} goes to the cinema with {c} dollars. {He} buys {a} tickets at {b} dollars each "
            "and popcorn for {d} dollars. How many dollars are left over?"),
        "heldout": (
            "{who} books {a} concert tickets at {b} pounds each plus a {d}-pound booking fee and "
            "hands over {c} pounds. How many pounds does {he} get back?",
            "With {c} dollars in {his} pocket, {who} pays for {a} museum entries at {b} dollars a "
            "person and a {d}-dollar guidebook. What is left in {his} pocket, in dollars?"),
    }),
    Shape("leftover shared", "({c} - {a} * {b}) / {n}", _leftover_shared, {
        "train": (
            "{who} has {c} sweets. {He} fills {a} party bags with {b} sweets each and shares the "
            "rest equally among {n} friends. How many sweets does each friend get?",
            "A club has {c} dollars. It buys {a} balls at {b} dollars each and splits the money "
            "left over equally among its {n} teams. How many dollars does each team get?",
            "{who} has {c} stamps. {He} sticks {b} stamps on each of {a} envelopes and hands the "
            "stamps that are left equally to {n} pen pals. How many stamps does each pen pal "
            "get?"),
        "heldout": (
            "A farmer picks {c} apples, sells {a} boxes of {b} apples each, and divides the "
            "remaining apples equally among {n} neighbours. How many apples does each neighbour "
            "receive?",
            "{who}'s class has {c} crayons. {a} packs of {b} crayons are put away in the "
            "cupboard, and the remaining crayons are shared equally among {n} tables. What number "
            "of crayons goes to each table?"),
    }),
    # whole kinds held out: never in training traffic
    Shape("share then more", "{c} / {n} + {d}", _share_then_more, {
        "heldout": (
            "{c} stickers are shared equally among {n} children. Then the teacher gives each "
            "child {d} more. How many stickers does each child have now?",
            "{who} is one of {n} players who share {c} points equally, and each player then earns "
            "{d} bonus points. What is {who}'s score?"),
    }),
    Shape("compare total", "{a} + ({a} + {b})", _compare_total, {
        "heldout": (
            "{other} has {a} stamps, and {who} has {b} more stamps than {other}. How many stamps "
            "do the two of them have together?",
            "A small jar holds {a} sweets, and a large jar holds {b} more sweets than the small "
            "one. How many sweets are in the two jars altogether?"),
    }),
    Shape("two purchases", "{a} * {b} + {c} * {d}", _two_purchases, {
        "heldout": (
            "{who} buys {a} pens at {b} dollars each and {c} notebooks at {d} dollars each. How "
            "many dollars does {he} spend altogether?",
            "For a party, {who} orders {a} pizzas costing {b} euros each and {c} cakes costing "
            "{d} euros each. What is the total bill in euros?"),
    }),
)
HELDOUT_ONLY = tuple(shape.name for shape in SHAPES if "train" not in shape.templates)


def shapes(split: str, ops: int) -> list[Shape]:
    """The shapes that `split` tells with `ops` operations."""
    return [shape for shape in SHAPES if split in shape.templates and shape.ops == ops]
