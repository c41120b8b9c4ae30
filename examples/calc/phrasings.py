"""The words of the calc word problems (examples/calc/problems.py puts them together): scenario
families, each with sentence templates per step, plus question forms, distractor sentences and
bare-expression forms, split into what training traffic sees and what the held-out set alone
uses.

    from examples.calc.phrasings import PHRASINGS
    PHRASINGS["heldout"].families          # whole scenarios never seen in training

A family tells a story about one running quantity: an opening sentence sets it (a plain number,
or a first operation: `{a}` groups of `{b}`, `{a}` shared `{b}` ways), each later sentence
applies one operator with `{n}`, and the question asks for the quantity at the end. Templates
are `str.format` strings over `{who}` and its pronouns (`{he} {He} {him} {his} {His} {self}`),
`{unit}` (one of the family's plural nouns), the numbers, and `{times}` (`twice`, `three
times`) or `{nth}` (`half`, `third`) for the same `{n}` in words. A question form combines a
family's direct question (`{Ask}`/`{ask}`, without its question mark) or its indirect one
(`{tell}`). Families, question forms, distractors and bare forms belong to one split each, so a
held-out problem shares no sentence template with training traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

# (name, subject pronoun): the pronouns of a name are looked up from it.
NAMES = (("Ada", "she"), ("Ben", "he"), ("Chen", "he"), ("Dara", "she"), ("Eli", "he"),
         ("Fatima", "she"), ("Goran", "he"), ("Hana", "she"), ("Ivan", "he"), ("Julia", "she"),
         ("Kofi", "he"), ("Lena", "she"), ("Mateo", "he"), ("Nadia", "she"))


@dataclass(frozen=True)
class Family:
    name: str
    units: tuple[str, ...]
    starts: tuple[str, ...]     # {a}: the quantity at the start, no operation yet
    products: tuple[str, ...]   # {a} * {b} is the first operation
    shares: tuple[str, ...]     # {a} / {b} is the first operation
    plus: tuple[str, ...]
    minus: tuple[str, ...]
    times: tuple[str, ...]
    divide: tuple[str, ...]
    ask: str                    # the direct question, capitalised, no question mark
    tell: str                   # the same question as a clause ("how many ... {who} has")

    def steps(self, op: str) -> tuple[str, ...]:
        return {"+": self.plus, "-": self.minus, "*": self.times, "/": self.divide}[op]


@dataclass(frozen=True)
class Phrasings:
    families: tuple[Family, ...]
    questions: tuple[str, ...]
    distractors: tuple[str, ...]  # {k}: the irrelevant number; {other}: another name
    bare: tuple[str, ...]         # {expression}


_TRAIN_FAMILIES = (
    Family(
        "shopping", ("dollars", "euros", "pounds"),
        starts=("{who} has {a} {unit} in {his} wallet.", "{who} goes to the market with {a} {unit}.",
                "{who} starts the week with {a} {unit} to spend."),
        products=("{who} sells {a} old comics for {b} {unit} each.",
                  "{who} works {a} hours at {b} {unit} an hour."),
        shares=("A prize of {a} {unit} is shared equally by {b} winners, and {who} is one of them.",),
        plus=("{He} finds {n} {unit} in an old coat.", "A friend pays {him} back {n} {unit}.",
              "{He} earns another {n} {unit} washing cars."),
        minus=("{He} spends {n} {unit} on a book.", "Lunch costs {him} {n} {unit}.",
               "{He} pays {n} {unit} for a train ticket."),
        times=("A lucky lottery ticket leaves {him} with {times} as much money.",
               "After selling a painting, {he} has {n} times the money {he} had."),
        divide=("{He} splits the money equally into {n} envelopes and keeps only one envelope.",
                "{He} shares the money equally between {n} people, {self} included, and keeps "
                "{his} share."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "sharing", ("marbles", "stickers", "stamps", "seashells"),
        starts=("{who} has a jar of {a} {unit}.", "{who} owns {a} {unit}.",
                "There are {a} {unit} in {who}'s collection."),
        products=("{who} has {a} bags with {b} {unit} in each.",
                  "{who} collects {b} {unit} a day for {a} days."),
        shares=("{a} {unit} are shared equally among {b} children, and {who} is one of them.",
                "{b} friends, {who} among them, divide {a} {unit} equally."),
        plus=("{His} cousin gives {him} {n} more.", "{He} wins {n} {unit} in a game."),
        minus=("{He} gives {n} {unit} to {his} little brother.", "{He} loses {n} of them in the park."),
        times=("After a big swap {he} has {times} as many {unit}.",
               "{His} collection grows to {n} times its size."),
        divide=("{He} shares all of them equally among {n} friends, {self} included, and keeps "
                "{his} share.", "{He} puts them into {n} equal piles and keeps one pile."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "bus", ("passengers", "people", "riders"),
        starts=("{who}'s bus leaves the depot with {a} {unit}.",
                "{who} drives a bus that starts out with {a} {unit} on board."),
        products=("{a} school groups of {b} {unit} each board {who}'s empty bus.",),
        shares=("{a} {unit} are split equally over {b} buses at the station; {who} drives one of "
                "them.",),
        plus=("At the next stop {n} {unit} get on.", "{n} more {unit} board at the market square."),
        minus=("{n} {unit} get off at the school.", "At the hospital, {n} {unit} step off."),
        times=("At the stadium stop the bus fills up to {times} as many {unit}.",
               "After the concert there are {n} times as many {unit} on board."),
        divide=("At the depot the {unit} are split equally over {n} smaller buses, and {who} "
                "drives one of them.",
                "The bus breaks down; its {unit} are shared equally among {n} replacement buses, "
                "and {who} drives one of them."),
        ask="How many {unit} are on {who}'s bus", tell="how many {unit} are on {who}'s bus"),
    Family(
        "baking", ("cookies", "muffins", "rolls", "cupcakes"),
        starts=("{who} bakes {a} {unit}.", "There are {a} {unit} on {who}'s counter."),
        products=("{who} bakes {a} trays of {b} {unit} each.",
                  "{who} makes {a} batches, each with {b} {unit}."),
        shares=("{who} packs {a} {unit} equally into {b} boxes and keeps one box.",),
        plus=("{He} bakes another {n}.", "A neighbour brings over {n} {unit}."),
        minus=("{n} of them burn and are thrown away.", "{His} family eats {n} {unit}."),
        times=("For the fair, {he} makes {times} as many.",
               "An order comes in, and {he} bakes until there are {n} times as many {unit}."),
        divide=("{He} packs them equally into {n} boxes and keeps one box.",
                "{He} puts them on {n} plates with the same number on each and takes one plate."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "classroom", ("pencils", "stickers", "crayons", "notebooks"),
        starts=("Teacher {who} has {a} {unit} in the supply cupboard.", "{who} brings {a} {unit} to class."),
        products=("{who} buys {a} packs of {b} {unit} for the class.",
                  "{who} orders {a} boxes holding {b} {unit} each."),
        shares=("The school hands out {a} {unit} equally to {b} classes, and {who} teaches one of "
                "them.",),
        plus=("The head teacher gives {him} {n} more {unit}.", "{He} finds {n} {unit} in a drawer."),
        minus=("{He} hands out {n} {unit} during the lesson.", "{n} {unit} go missing."),
        times=("A donation leaves {him} with {times} as many {unit}.",
               "By the end of term {he} has {n} times as many {unit}."),
        divide=("{He} sorts them into {n} equal trays and keeps one tray on {his} desk.",
                "{He} shares them equally among {n} classrooms and keeps the share of {his} own room."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "farm", ("eggs", "apples", "potatoes"),
        starts=("Farmer {who} collects {a} {unit}.", "{who} has {a} {unit} in the barn."),
        products=("{who} picks {a} baskets of {b} {unit}.",),
        shares=("{a} {unit} from the harvest are shared equally by {b} farmers; {who} is one of "
                "them.",),
        plus=("{He} gathers {n} more in the afternoon.", "A neighbour gives {him} {n} {unit}."),
        minus=("{He} sells {n} {unit} at the market.", "{n} {unit} go bad and are thrown out."),
        times=("A good week leaves {him} with {times} as many {unit}.",
               "After the harvest {he} has {n} times as many {unit}."),
        divide=("{He} fills {n} crates equally with them and keeps one crate.",
                "{He} splits them equally among {n} market stalls and keeps the share of one stall."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "library", ("books", "magazines", "comics"),
        starts=("{who} runs a small library with {a} {unit}.",
                "The shelves {who} looks after hold {a} {unit}."),
        products=("{who} fills {a} shelves with {b} {unit} on each.",),
        shares=("{a} donated {unit} are split equally among {b} libraries, one of them run by "
                "{who}.",),
        plus=("A donor gives {him} {n} {unit}.", "{He} buys {n} new {unit}."),
        minus=("Readers borrow {n} {unit}.", "{n} old {unit} are thrown away."),
        times=("After a big donation the library has {times} as many {unit}.",
               "Over the year the collection grows to {n} times its size."),
        divide=("{He} splits them equally over {n} branch libraries and keeps one share.",
                "{He} shares them equally among {n} school libraries, {his} own among them, and "
                "keeps its share."),
        ask="How many {unit} does {who}'s library have", tell="how many {unit} {who}'s library has"),
)

_HELDOUT_FAMILIES = (
    Family(
        "saving", ("dollars", "euros", "pounds"),
        starts=("{who}'s piggy bank holds {a} {unit}.", "{who} has saved {a} {unit}."),
        products=("{who} puts {b} {unit} into a savings jar every week for {a} weeks.",
                  "{who} saves {b} {unit} a month for {a} months."),
        shares=("{who} and {his} siblings, {b} children in all, split {a} {unit} of birthday money "
                "equally.",),
        plus=("For {his} birthday {he} gets {n} {unit} more.", "{He} adds {n} {unit} of pocket money."),
        minus=("{He} takes out {n} {unit} for a game.", "{He} buys a present for {n} {unit}."),
        times=("The bank's special offer leaves {him} with {times} the amount.",
               "Over the years the savings grow to {n} times as much."),
        divide=("{He} splits the savings into {n} equal parts and spends all but one part.",
                "{He} shares the savings equally with {his} siblings, {n} children in all, and "
                "keeps {his} part."),
        ask="How many {unit} has {who} saved", tell="how many {unit} {who} has saved"),
    Family(
        "garden", ("tulips", "roses", "tomato plants", "bean plants"),
        starts=("{who} plants {a} {unit}.", "{who}'s garden has {a} {unit}."),
        products=("{who} plants {a} rows with {b} {unit} in each row.",),
        shares=("{a} {unit} are planted equally in {b} beds; {who} looks after one bed.",),
        plus=("Later {he} plants {n} more.", "{His} neighbour gives {him} {n} {unit} to plant."),
        minus=("Rabbits eat {n} of the {unit}.", "{n} {unit} die in a frost."),
        times=("By summer there are {times} as many {unit}.",
               "The {unit} spread until there are {n} times as many."),
        divide=("{He} splits them into {n} equal beds and gives all but one bed to friends.",
                "{He} shares them equally among {n} gardeners, {self} included, and keeps {his} "
                "share."),
        ask="How many {unit} does {who} look after", tell="how many {unit} {who} looks after"),
    Family(
        "deliveries", ("parcels", "boxes", "crates"),
        starts=("{who}'s van is loaded with {a} {unit}.", "{who} starts the shift with {a} {unit} to deliver."),
        products=("{who} loads {a} pallets with {b} {unit} each into a lorry.",),
        shares=("{a} {unit} are split evenly among {b} vans; {who} drives one of them.",),
        plus=("{n} more {unit} arrive from the depot.", "{He} picks up {n} {unit} on the way."),
        minus=("{He} delivers {n} {unit} in the morning.", "{n} {unit} are sent back to the depot."),
        times=("Before the holidays the load grows to {times} as many {unit}.",
               "A rush order makes the load {n} times as big."),
        divide=("The {unit} are shared out evenly over {n} vans, and {who} takes one van.",
                "{He} splits the load equally with colleagues, {n} drivers in all, {self} included."),
        ask="How many {unit} does {who} still have to deliver",
        tell="how many {unit} {who} still has to deliver"),
    Family(
        "travel", ("kilometres", "miles"),
        starts=("{who} is {a} {unit} from home.", "{who} has cycled {a} {unit} away from home."),
        products=("{who} drives away from home at {b} {unit} an hour for {a} hours.",),
        shares=("{who} rides the first of {b} equal stages of a route that leads {a} {unit} away "
                "from home.",),
        plus=("{He} goes {n} {unit} further.", "Then {he} travels another {n} {unit} away from home."),
        minus=("{He} turns around and heads {n} {unit} back towards home.",
               "{He} rides {n} {unit} back towards home to fetch a forgotten bag."),
        times=("By evening {he} is {times} as far from home.",
               "{He} keeps going until {he} is {n} times as far from home."),
        divide=("{He} heads back until the distance from home is cut to one {nth} of what it was.",
                "{He} rides back until only one {nth} of the distance home is left."),
        ask="How many {unit} from home is {who}", tell="how many {unit} from home {who} is"),
)

PHRASINGS = {
    "train": Phrasings(
        _TRAIN_FAMILIES,
        questions=("{Ask} now?", "{Ask} at the end?", "After all that, {ask}?", "Work out {tell}.",
                   "Find {tell}."),
        distractors=("{other} is {k} years old.", "It is {k} degrees outside.",
                     "{who}'s house is number {k} on its street.", "{other} lives {k} doors down."),
        bare=("What is {expression}?", "Compute {expression}.", "Calculate {expression}."),
    ),
    "heldout": Phrasings(
        _HELDOUT_FAMILIES,
        questions=("{Ask} once all this is done?", "In the end, {ask}?", "Determine {tell}.",
                   "Figure out {tell}."),
        distractors=("The town has {k} street lamps.", "{other}'s phone number ends in {k}.",
                     "The radio plays song number {k} of the day."),
        bare=("Evaluate {expression}.", "What does {expression} equal?",
              "Give the value of {expression}."),
    ),
}
SPLITS = tuple(PHRASINGS)
UNITS = tuple(sorted({unit for split in PHRASINGS.values() for family in split.families
                      for unit in family.units}))
