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

Training has far more of each (32 scenario families: stock, a fish tank, a club, a video game, an
inbox, a museum tour, a choir, a wizard's potions, a hospital ward, grams of sugar in a jar, ...;
21 question forms, 19 distractors, 13 bare forms) and varies how a sentence is built, not only its
nouns: the same operator said with different verbs (sell, pop, spill, unravel, wash overboard,
brew, recruit, ...), in the passive, with the number after its noun ("a donation of {n} cans"),
in a subordinate clause ("After {n} of them leave ..., "), opening with a time or place, or as a
fraction ("only one {nth} of them stay"), so a model learns to read a story into arithmetic
rather than to recognise a handful of templates. Whatever the words, a divide step leaves
exactly one of `{n}` equal shares and a times step makes the quantity `{n}` times as large.
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
    Family(
        "aquarium", ("fish", "guppies", "goldfish", "snails"),
        starts=("{who}'s fish tank holds {a} {unit}.",
                "There are {a} {unit} living in {who}'s aquarium."),
        products=("{who} buys {a} bags with {b} {unit} in each and empties them all into a new "
                  "tank.",),
        shares=("A pet shop splits {a} {unit} equally among {b} tanks, and {who} takes one of the "
                "tanks home.",),
        plus=("{n} baby {unit} are born overnight.",
              "{He} adds {n} more {unit} from the pet shop."),
        minus=("{He} gives {n} of the {unit} to a friend.",
               "{He} moves {n} of the {unit} to a second tank."),
        times=("The {unit} breed until there are {times} as many.",
               "By spring the tank holds {n} times as many {unit}."),
        divide=("Only one {nth} of the {unit} stay in the tank; {he} gives the rest to a school.",
                "{He} splits the {unit} equally into {n} groups, keeps one group in the tank and "
                "gives the other groups away."),
        ask="How many {unit} are in {who}'s tank", tell="how many {unit} are in {who}'s tank"),
    Family(
        "car park", ("cars", "motorbikes", "vehicles"),
        starts=("The car park that {who} looks after has {a} {unit} in it.",
                "At opening time, {a} {unit} are parked in {who}'s car park."),
        products=("{a} rows of {b} {unit} each fill the empty car park that {who} runs.",),
        shares=("{b} car parks share {a} {unit} from a festival equally, and {who} runs one of the "
                "car parks.",),
        plus=("{n} more {unit} pull in before noon.",
              "During the football match, {n} {unit} are parked there."),
        minus=("When the shops close, the owners drive {n} of the {unit} away.",
               "A tow truck removes {n} of the {unit}."),
        times=("By rush hour there are {n} times as many {unit} in it.",
               "A concert nearby fills the car park with {times} as many {unit}."),
        divide=("Because of roadworks, only one {nth} of the {unit} may stay, and the others "
                "leave.",
                "The {unit} are split into {n} equal groups, and every group but one is sent to "
                "another car park."),
        ask="How many {unit} are in {who}'s car park",
        tell="how many {unit} are in {who}'s car park"),
    Family(
        "sports club", ("members", "players", "athletes"),
        starts=("{who} coaches a club of {a} {unit}.", "{who}'s sports club has {a} {unit}."),
        products=("{who}'s club is made up of {a} teams of {b} {unit} each.",),
        shares=("{a} {unit} sign up and are divided equally into {b} clubs; {who} coaches one of "
                "the clubs.",),
        plus=("{n} new {unit} join after an open day.",
              "A partner club merges in, bringing {n} {unit} with it."),
        minus=("At the end of the season the club says goodbye to {n} of its {unit}.",
               "{He} loses {n} of the {unit} to a rival club."),
        times=("A report on television brings in so many {unit} that the club grows {n}-fold.",
               "Within a year the club has {times} as many {unit}."),
        divide=("Only one {nth} of the {unit} stay on for the winter; the rest leave.",
                "The club splits into {n} equal clubs, and {who} keeps coaching one of them."),
        ask="How many {unit} does {who}'s club have", tell="how many {unit} {who}'s club has"),
    Family(
        "video game", ("coins", "points", "gems", "stars"),
        starts=("{who} starts a game with {a} {unit}.",
                "{who}'s game character carries {a} {unit}."),
        products=("Starting a new game with nothing, {who} clears {a} levels and collects {b} "
                  "{unit} on each one.",),
        shares=("{b} players on a team, {who} among them, split {a} {unit} from a chest equally.",),
        plus=("{He} picks up {n} {unit} in a cave.", "A bonus round awards {him} {n} {unit}.",
              "{He} defeats a dragon, which is worth {n} {unit}."),
        minus=("{He} spends {n} of the {unit} on a new sword.",
               "Falling into lava costs {him} {n} of {his} {unit}."),
        times=("A power-up multiplies {his} {unit} by {n}.",
               "After a golden mushroom, {he} has {times} as many {unit} as before."),
        divide=("A curse cuts {his} {unit} to one {nth} of what {he} had.",
                "{He} shares the {unit} equally with {his} team, {n} players in all, {self} "
                "included, and keeps {his} share."),
        ask="How many {unit} does {who} have in the game",
        tell="how many {unit} {who} has in the game"),
    Family(
        "toy workshop", ("toy cars", "teddy bears", "robots", "dolls"),
        starts=("{who}'s workshop has {a} {unit} ready.",
                "On Monday morning, {who}'s workshop holds {a} finished {unit}."),
        products=("Starting from an empty store room, {who}'s machine makes {b} {unit} an hour for "
                  "{a} hours.", "{a} workers in {who}'s new workshop make {b} {unit} each."),
        shares=("A toy factory shares the {a} {unit} in its store room equally among its {b} "
                "workshops, and {who} runs one of the workshops.",),
        plus=("A batch of {n} {unit} comes off the line.",
              "The night shift makes another {n} {unit}."),
        minus=("Inspectors reject {n} of the {unit}.",
               "{He} sells {n} of the {unit} to a toy shop."),
        times=("A new machine works so fast that soon there are {times} as many {unit}.",
               "A big order pushes production up until there are {n} times as many {unit}."),
        divide=("The {unit} are divided equally into {n} batches, and every batch but one is sold.",
                "{He} gives all of the {unit} away except one {nth} of them."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "food bank", ("cans", "tins", "jars"),
        starts=("{who}'s food bank has {a} {unit} of food on its shelves.",
                "{who} counts {a} {unit} in the food bank's store room."),
        products=("{a} families each give {b} {unit} to {who}'s new food bank.",
                  "{who} opens a food bank by collecting {b} {unit} at each of {a} schools."),
        shares=("A supermarket gives {a} {unit}, split equally among {b} food banks; {who} runs "
                "one of the food banks.",),
        plus=("A donation of {n} {unit} comes in.", "{n} {unit} are dropped off by a local shop.",
              "The scouts collect {n} {unit} for {him}."),
        minus=("{He} hands out {n} of the {unit} to families in need.",
               "{He} throws away {n} of the {unit} because they are past their date."),
        times=("After an appeal in the newspaper, {he} has {times} as many {unit}.",
               "A matching gift from a company multiplies the number of {unit} by {n}."),
        divide=("{He} sends all but one {nth} of the {unit} to a shelter across town.",
                "{He} shares the {unit} equally among {n} food banks, {his} own included, and "
                "keeps {his} own share."),
        ask="How many {unit} are in {who}'s food bank",
        tell="how many {unit} are in {who}'s food bank"),
    Family(
        "playlist", ("songs", "tracks", "tunes"),
        starts=("{who}'s playlist has {a} {unit}.", "{who} makes a playlist of {a} {unit}."),
        products=("{who} fills an empty playlist with {a} albums of {b} {unit} each.",),
        shares=("A DJ splits {a} {unit} equally into {b} playlists and gives one playlist to "
                "{who}.",),
        plus=("{He} adds {n} {unit} from a new album.", "A friend sends {him} {n} {unit} to add.",
              "{n} {unit} are added after a concert."),
        minus=("{He} deletes {n} of the {unit}.",
               "{He} removes {n} of the {unit} because {he} is tired of them."),
        times=("{He} keeps adding {unit} until the playlist is {n} times as long.",
               "Over the summer the playlist grows to {times} its length."),
        divide=("{He} cuts the playlist down to one {nth} of its length.",
                "{He} splits the {unit} into {n} equal playlists and keeps only one of them."),
        ask="How many {unit} are on {who}'s playlist",
        tell="how many {unit} are on {who}'s playlist"),
    Family(
        "hotel", ("guests", "visitors", "tourists"),
        starts=("{who}'s hotel has {a} {unit} staying.",
                "{who} runs a hotel with {a} {unit} in it."),
        products=("{who}'s hotel has {a} floors, and {b} {unit} stay on each floor.",),
        shares=("A conference books {a} {unit} into {b} hotels, the same number in each, and one "
                "of the hotels is {who}'s.",),
        plus=("A wedding party brings {n} more {unit}.",
              "Late at night, {n} more {unit} check in."),
        minus=("{He} says goodbye to {n} of the {unit} at checkout.",
               "A coach takes {n} of the {unit} to the airport."),
        times=("During the festival the hotel holds {times} as many {unit}.",
               "A big event fills the hotel with {n} times as many {unit}."),
        divide=("Only one {nth} of the {unit} stay for a second week.",
                "Building work closes most rooms: the {unit} are split into {n} equal groups, and "
                "all groups but one move to other hotels."),
        ask="How many {unit} are staying at {who}'s hotel",
        tell="how many {unit} are staying at {who}'s hotel"),
    Family(
        "beehive", ("bees", "worker bees"),
        starts=("{who} keeps a hive with {a} {unit}.",
                "A swarm of {a} {unit} moves into {who}'s empty hive."),
        products=("{who} starts a new hive with {a} packages of {b} {unit} each.",),
        shares=("A beekeeping club splits {a} {unit} equally into {b} hives and gives one hive to "
                "{who}.",),
        plus=("{n} young {unit} hatch during the week.", "{n} stray {unit} join the hive."),
        minus=("Cold weather kills {n} of the {unit}.", "Birds catch {n} of the {unit}."),
        times=("By midsummer the number of {unit} has grown {n}-fold.",
               "In spring the colony grows to {times} its size."),
        divide=("The colony swarms: the {unit} split into {n} equal groups, and only one group "
                "stays in the hive.",
                "{He} divides the {unit} equally into {n} hives, keeps one hive and sells the "
                "others."),
        ask="How many {unit} live in {who}'s hive", tell="how many {unit} live in {who}'s hive"),
    Family(
        "shop stock", ("shirts", "umbrellas", "backpacks", "jackets"),
        starts=("{who}'s shop has {a} {unit} in stock.",
                "{who} counts the stock and finds {a} {unit}."),
        products=("{who} fills {a} empty racks with {b} {unit} on each rack.",),
        shares=("{a} {unit} are divided equally among a chain's {b} shops, and {who} manages one "
                "of the shops.",),
        plus=("Customers return {n} {unit}.", "{He} buys {n} {unit} from a wholesaler."),
        minus=("Customers buy {n} of the {unit}.", "{He} sells {n} of the {unit} in a sale."),
        times=("After a restock there are {times} as many {unit} in the shop.",
               "{He} orders enough to have {n} times as many {unit}."),
        divide=("A closing-down sale leaves only one {nth} of the {unit}.",
                "{He} splits the {unit} equally among {n} shops, {his} own included, and keeps "
                "{his} shop's share."),
        ask="How many {unit} does {who}'s shop have in stock",
        tell="how many {unit} {who}'s shop has in stock"),
    Family(
        "photos", ("photos", "pictures", "snapshots"),
        starts=("{who}'s phone holds {a} {unit}.", "There are {a} {unit} in {who}'s camera roll."),
        products=("With a new phone, {who} takes {b} {unit} on each of {a} days out.",),
        shares=("{a} {unit} from a class trip are shared equally among {b} classmates, {who} "
                "included.",),
        plus=("{He} takes {n} {unit} at a wedding.",
              "{His} grandfather sends {him} {n} old {unit}."),
        minus=("{He} deletes {n} of the blurry {unit}.",
               "{He} clears out {n} of the {unit} to free up space."),
        times=("After the holidays {he} has {times} as many {unit}.",
               "{He} copies in old {unit} until there are {n} times as many."),
        divide=("{He} keeps only one {nth} of the {unit} and deletes the rest.",
                "{He} sorts the {unit} into {n} equal folders and deletes every folder but one."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "inbox", ("emails", "messages"),
        starts=("{who}'s inbox holds {a} {unit}.", "There are {a} unread {unit} in {who}'s inbox."),
        products=("{a} colleagues each send {b} {unit} to {who}'s new, empty inbox.",),
        shares=("{a} {unit} to a help desk are sorted equally into the inboxes of {b} staff, {who} "
                "among them.",),
        plus=("{n} new {unit} arrive overnight.", "A newsletter service sends {him} {n} {unit}."),
        minus=("{He} answers {n} of the {unit} and archives them.",
               "{He} deletes {n} of the {unit} without reading them."),
        times=("After a week away {he} has {times} as many {unit}.",
               "A mailing list floods the inbox until there are {n} times as many {unit}."),
        divide=("A filter moves all but one {nth} of the {unit} into the spam folder.",
                "{He} shares the {unit} equally with {his} team, {n} people in all, {self} "
                "included, and keeps {his} share in the inbox."),
        ask="How many {unit} are in {who}'s inbox", tell="how many {unit} are in {who}'s inbox"),
    Family(
        "animal shelter", ("dogs", "cats", "kittens", "puppies"),
        starts=("{who} runs an animal shelter that looks after {a} {unit}.",
                "There are {a} {unit} at {who}'s shelter."),
        products=("{who}'s new shelter takes in {b} {unit} a month for {a} months, and none "
                  "leave.",),
        shares=("{a} rescued {unit} are split equally among {b} shelters, and {who} runs one of "
                "the shelters.",),
        plus=("{n} stray {unit} are brought in.", "Another shelter sends {him} {n} {unit}."),
        minus=("Families adopt {n} of the {unit}.", "{He} finds new homes for {n} of the {unit}."),
        times=("After a hard winter the shelter holds {times} as many {unit}.",
               "The shelter grows until it cares for {n} times as many {unit}."),
        divide=("The {unit} are shared equally among {n} shelters, {who}'s own included, and {he} "
                "keeps {his} shelter's share.",
                "Foster families take all but one {nth} of the {unit}."),
        ask="How many {unit} are at {who}'s shelter",
        tell="how many {unit} are at {who}'s shelter"),
    Family(
        "museum tour", ("visitors", "tourists", "students"),
        starts=("{who} is a museum guide with a tour group of {a} {unit}.",
                "{who}'s museum tour sets off from the entrance hall with {a} {unit}.",
                "At ten o'clock, {a} {unit} gather in the entrance hall for {who}'s tour."),
        products=("{a} groups of {b} {unit} each come together for {who}'s museum tour.",
                  "{a} minibuses with {b} {unit} on each pull up at the museum, and everyone on "
                  "them joins {who}'s tour."),
        shares=("{a} {unit} arrive at the museum and are split equally into {b} tours; {who} "
                "guides one of them.",),
        plus=("In the dinosaur hall, {n} more {unit} join the group.",
              "The group gains {n} {unit} who were waiting by the stairs.",
              "A late coach adds another {n} {unit} to the tour."),
        minus=("After {n} of the {unit} leave for the café, the tour goes on without them.",
               "{He} loses {n} of the {unit} in the crowd by the mummies.",
               "At the gift shop, {n} {unit} say goodbye and leave the tour."),
        times=("A school trip joins in, and the group becomes {times} as big.",
               "By the time they reach the paintings, the group has grown to {n} times its "
               "size."),
        divide=("The next room is small, so the group is split into {n} smaller groups of equal "
                "size, and {who} stays with one of them.",
                "Only one {nth} of the {unit} stay for the last room; the rest head for the exit.",
                "The {unit} are divided evenly among {n} guides, and {who} is one of those "
                "guides."),
        ask="How many {unit} are in {who}'s tour group",
        tell="how many {unit} are in {who}'s tour group"),
    Family(
        "choir", ("singers", "members"),
        starts=("{who} leads a choir of {a} {unit}.", "{a} {unit} sing in {who}'s choir."),
        products=("{who}'s new choir is formed from {a} school choirs of {b} {unit} each.",
                  "{who} starts a choir from nothing and signs up {b} {unit} in each of {a} "
                  "towns."),
        shares=("{a} {unit} who sign up for a festival are split equally into {b} choirs, and "
                "{who} leads one of them.",),
        plus=("After an open rehearsal, {n} new {unit} join.",
              "{n} {unit} from a neighbouring village are welcomed into the choir.",
              "{He} recruits another {n} {unit} at the summer fair."),
        minus=("{He} loses {n} {unit} when rehearsals move to Sunday mornings.",
               "When the concert season ends, the choir says farewell to {n} of its {unit}.",
               "{n} {unit} move away, so they leave the choir."),
        times=("A concert on television makes the choir so popular that it swells to {times} "
               "its size.",
               "Over ten years the number of {unit} is multiplied by {n}."),
        divide=("The choir is too big for the hall, so it splits into {n} equal choirs and {who} "
                "goes on leading one of them.",
                "Only one {nth} of the {unit} stay on after the choir's founder retires."),
        ask="How many {unit} does {who}'s choir have", tell="how many {unit} {who}'s choir has"),
    Family(
        "campsite", ("tents", "caravans"),
        starts=("{who} runs a campsite with {a} {unit} on it.",
                "On Friday evening there are {a} {unit} at {who}'s campsite."),
        products=("{a} scout troops arrive at {who}'s empty campsite, each with {b} {unit}.",
                  "{who} opens a new campsite, and each of its {a} fields fills up with {b} "
                  "{unit}."),
        shares=("A festival sends {a} {unit} to {b} campsites, the same number to each, and {who} "
                "runs one of those campsites.",),
        plus=("{n} more {unit} arrive before dark.", "During the night, another {n} {unit} turn up.",
              "A family reunion brings {n} {unit} to the site."),
        minus=("The next morning, {n} of the {unit} are packed up and taken away.",
               "Heavy rain floods the lower field, and {n} {unit} have to leave.",
               "When the school holidays end, {n} {unit} leave the site."),
        times=("For the summer holidays the site fills up with {times} as many {unit}.",
               "When a music festival starts nearby, the number of {unit} becomes {n} times what "
               "it was."),
        divide=("A storm is coming, and all but one {nth} of the {unit} leave the site.",
                "The {unit} are shared out equally among {n} campsites in the valley, and {who}'s "
                "campsite is one of them."),
        ask="How many {unit} are at {who}'s campsite", tell="how many {unit} are at {who}'s campsite"),
    Family(
        "potions", ("potions", "elixirs"),
        starts=("The wizard {who} has {a} {unit} on {his} shelf.",
                "In {who}'s tower there are {a} {unit}."),
        products=("{who} brews {b} {unit} a night for {a} nights.",
                  "{a} apprentices each hand {b} {unit} to {who}, who had none before."),
        shares=("A guild of wizards divides {a} {unit} equally among its {b} members, and {who} "
                "is one of them.",),
        plus=("{He} brews another {n} {unit}.", "{n} {unit} are bought from a travelling merchant.",
              "A grateful king rewards {him} with {n} {unit}."),
        minus=("A clumsy apprentice knocks over {n} of the {unit}, and they are lost.",
               "{He} drinks {n} of the {unit} to test them.",
               "{n} {unit} are sold to knights before a battle."),
        times=("A copying spell leaves {him} with {times} as many {unit}.",
               "{He} enchants the shelf so that the number of {unit} is multiplied by {n}."),
        divide=("A spell goes wrong and turns all but one {nth} of the {unit} into water.",
                "{He} divides the {unit} equally among {n} wizards, {self} included, and keeps one "
                "share."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "pirate", ("gold coins", "silver coins", "pearls"),
        starts=("Captain {who} has {a} {unit} in a chest.", "{who}'s treasure chest holds {a} {unit}.",
                "{who}, a pirate, keeps {a} {unit} hidden under {his} bunk."),
        products=("Starting with an empty chest, {who} takes {b} {unit} from each of {a} ships.",
                  "{who} digs up {a} buried pots holding {b} {unit} each."),
        shares=("{b} pirates, {who} one of them, share a haul of {a} {unit} equally.",),
        plus=("On a desert island {he} digs up {n} more {unit}.",
              "A parrot leads {him} to {n} {unit} hidden in a cave.",
              "{n} {unit} are won by {him} in a game of dice."),
        minus=("A storm washes {n} of the {unit} overboard.", "{He} pays the ship's cook {n} {unit}.",
               "{n} of the {unit} are stolen by a rival crew."),
        times=("After capturing a merchant ship, {he} has {times} as many {unit}.",
               "The treasure grows until {he} owns {n} times as many {unit}."),
        divide=("{He} hands all but one {nth} of the {unit} to the crew.",
                "{He} divides the {unit} into {n} equal heaps, one for each pirate on board, {self} "
                "included, and keeps {his} heap."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "hospital ward", ("patients",),
        starts=("Nurse {who}'s ward has {a} {unit}.",
                "There are {a} {unit} on the ward that {who} runs."),
        products=("Over {a} days, {b} {unit} a day are admitted to {who}'s new ward, and none go "
                  "home.",
                  "{who}'s new ward takes in {a} groups of {b} {unit} from a hospital that is "
                  "closing."),
        shares=("A closing hospital moves {a} {unit} to {b} wards in equal numbers; one of the "
                "wards is {who}'s.",),
        plus=("{n} {unit} are admitted during the night.", "An ambulance brings in {n} more {unit}."),
        minus=("{n} of the {unit} are well enough to go home.",
               "The doctors send {n} {unit} home after their checks.",
               "{He} moves {n} {unit} to another ward."),
        times=("During a flu outbreak the ward holds {times} as many {unit}.",
               "By winter the number of {unit} has risen to {n} times what it was."),
        divide=("The {unit} are spread equally over {n} wards, and {who}'s ward is one of them.",
                "Only one {nth} of the {unit} still need a bed; the rest go home."),
        ask="How many {unit} are on {who}'s ward", tell="how many {unit} are on {who}'s ward"),
    Family(
        "video channel", ("subscribers", "followers"),
        starts=("{who}'s video channel has {a} {unit}.", "{a} {unit} watch {who}'s cooking channel."),
        products=("{who} starts a channel from scratch and gains {b} {unit} a week for {a} weeks.",
                  "{who}'s channel starts with none; each of {his} first {a} videos brings in {b} "
                  "{unit}."),
        shares=("When a big channel closes, its {a} {unit} move in equal numbers to {b} smaller "
                "channels, one of them {who}'s.",),
        plus=("A new video brings in {n} {unit}.", "After a live stream, {n} more {unit} sign up.",
              "A shout-out from a friend wins {him} {n} {unit}."),
        minus=("{n} {unit} leave after a boring video.",
               "{He} loses {n} of the {unit} when {he} stops posting for a month."),
        times=("One video goes viral, and the channel ends up with {times} as many {unit}.",
               "By the end of the year the number of {unit} is {n} times what it was."),
        divide=("A clean-up removes fake accounts, leaving only one {nth} of the {unit}.",
                "{He} splits the channel into {n} channels with equal numbers of {unit} and keeps "
                "only one of them."),
        ask="How many {unit} does {who}'s channel have", tell="how many {unit} {who}'s channel has"),
    Family(
        "knitting", ("scarves", "hats", "jumpers"),
        starts=("{who} has knitted {a} {unit} for the winter market.",
                "{who}'s knitting basket holds {a} finished {unit}."),
        products=("{who} knits {b} {unit} a week for {a} weeks.",
                  "{a} members of {who}'s knitting club each hand {him} {b} {unit}."),
        shares=("{a} {unit} from a knitting club are shared equally among its {b} members, {who} "
                "among them.",),
        plus=("{He} finishes {n} more {unit}.", "{His} grandmother sends {him} {n} {unit} that she "
              "has made."),
        minus=("At the market, {n} of the {unit} are sold.",
               "{He} unravels {n} of the {unit} because they came out too small.",
               "Moths ruin {n} of the {unit}, and {he} throws them out."),
        times=("Over the winter {his} pile of {unit} grows to {times} its size.",
               "With a new knitting machine {he} soon has {n} times as many {unit}."),
        divide=("{He} keeps one {nth} of the {unit} and gives the others to charity.",
                "{He} sorts the {unit} into {n} equal piles and gives away every pile but one."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "zoo", ("penguins", "flamingos", "meerkats"),
        starts=("{who} is the zoo keeper in charge of {a} {unit}.",
                "The zoo's {a} {unit} are all fed by {who}."),
        products=("{who}'s new enclosure receives {a} groups of {b} {unit} from other zoos.",
                  "{a} zoos each send {b} {unit} to the empty enclosure that {who} runs."),
        shares=("A wildlife park gives away {a} {unit} in equal numbers to {b} zoos; {who} cares "
                "for the ones that come to {his} zoo.",),
        plus=("In spring, the group gains {n} young {unit}.", "{n} {unit} arrive from a zoo abroad."),
        minus=("{n} of the {unit} are moved to a wildlife park.",
               "{He} sends {n} {unit} to a zoo in another country."),
        times=("After a few good breeding seasons there are {times} as many {unit}.",
               "The group of {unit} grows until it is {n} times as large."),
        divide=("The {unit} are split into {n} equal groups, and every group but {who}'s goes to "
                "a new zoo.",
                "Only one {nth} of the {unit} remain in {his} care after the others are released "
                "into the wild."),
        ask="How many {unit} are in {who}'s care", tell="how many {unit} are in {who}'s care"),
    Family(
        "kitchen jar", ("grams of sugar", "grams of flour", "grams of rice"),
        starts=("{who}'s kitchen jar holds {a} {unit}.",
                "{who} weighs the jar and finds {a} {unit} in it."),
        products=("Starting with an empty jar, {who} adds {b} {unit} to it {a} times.",
                  "Into an empty jar, {who} tips {a} sachets with {b} {unit} in each."),
        shares=("{a} {unit} from a large sack are shared equally among {b} jars, and {who} takes "
                "one jar home.",),
        plus=("{He} tops up the jar with {n} {unit}.", "{n} {unit} are added from a new packet."),
        minus=("{He} uses {n} {unit} for a cake.", "{He} spills {n} {unit} on the floor.",
               "{n} {unit} go into a batch of pancakes."),
        times=("After a trip to the shop, the jar holds {times} as much.",
               "{He} refills the jar until it holds {n} times the amount it held before."),
        divide=("{He} divides what is in the jar into {n} equal portions and keeps only one "
                "portion in the jar.",
                "{He} uses everything in the jar except one {nth} of it."),
        ask="How many {unit} are in {who}'s jar", tell="how many {unit} are in {who}'s jar"),
    Family(
        "balloons", ("balloons", "party balloons"),
        starts=("{who} has {a} {unit} for a birthday.",
                "There are {a} {unit} tied to the fence outside {who}'s house."),
        products=("{a} friends each blow up {b} {unit} for {who}.",
                  "{who} ties {a} bunches of {b} {unit} to the chairs."),
        shares=("{b} children, {who} among them, each get an equal share of {a} {unit}.",),
        plus=("{He} blows up another {n}.", "A clown hands {him} {n} more {unit}."),
        minus=("{He} accidentally pops {n} of the {unit}.", "A gust of wind carries {n} {unit} away.",
               "{n} {unit} float off into the sky."),
        times=("By the start of the party {he} has {times} as many {unit}.",
               "With a helium pump, {he} soon has {n} times the number of {unit}."),
        divide=("{He} ties the {unit} into {n} equal bunches and keeps one bunch.",
                "{He} lets all but one {nth} of the {unit} go at the end of the party."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
    Family(
        "fishing boat", ("mackerel", "sardines", "crabs"),
        starts=("{who}'s fishing boat has {a} {unit} in its hold.",
                "{who} has caught {a} {unit} so far today."),
        products=("{who} hauls up {a} nets with {b} {unit} in each.",
                  "{who} catches {b} {unit} an hour for {a} hours."),
        shares=("{a} {unit} are shared equally by the {b} fishers of a crew, {who} among them.",),
        plus=("The next net brings up {n} more {unit}.", "Before sunset {he} catches another {n}."),
        minus=("{n} of the {unit} are too small and go back into the sea.",
               "{He} sells {n} {unit} to a restaurant on the harbour.",
               "Gulls snatch {n} of the {unit} from the deck."),
        times=("A huge shoal comes by, and soon {he} has {times} as many {unit}.",
               "By the end of the week the catch is {n} times as big."),
        divide=("The {unit} are divided equally among the {n} people on the boat, {who} included, "
                "and {he} keeps {his} share.",
                "{He} keeps one {nth} of the {unit} and sells the rest at the harbour."),
        ask="How many {unit} does {who} have", tell="how many {unit} {who} has"),
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
                   "Find {tell}.", "So, {ask}?", "{Ask} by now?", "{Ask} after these changes?",
                   "At this point, {ask}?", "Tell me {tell}.", "Calculate {tell}.",
                   "Can you say {tell}?", "Now {ask}?", "{Ask} in total?",
                   "After the last change, {ask}?", "Please work out {tell}.", "Compute {tell}.",
                   "I need to know {tell}.", "Could you tell me {tell}?", "Question: {ask}?",
                   "Your task is to find {tell}."),
        distractors=("{other} is {k} years old.", "It is {k} degrees outside.",
                     "{who}'s house is number {k} on its street.", "{other} lives {k} doors down.",
                     "{other} owns {k} board games.", "{who}'s favourite number is {k}.",
                     "{other} sits in seat {k} at the cinema.",
                     "It has rained on {k} days this year.",
                     "{who}'s gym locker is number {k}.", "{other}'s jigsaw puzzle has {k} pieces.",
                     "The school down the road is {k} years old.",
                     "{who}'s football shirt has the number {k} on the back.",
                     "{other} practised the piano for {k} minutes yesterday.",
                     "{who}'s train leaves from platform {k}.", "{other}'s cousin turns {k} next week.",
                     "{who} lives on floor {k} of a tall building.",
                     "A crossword in today's paper has {k} clues.",
                     "{other} keeps {k} old keys in a drawer.",
                     "It took {other} {k} minutes to walk to school today."),
        bare=("What is {expression}?", "Compute {expression}.", "Calculate {expression}.",
              "Work out {expression}.", "Solve {expression}.", "How much is {expression}?",
              "What do you get for {expression}?", "Find the result of {expression}.",
              "What's {expression}?", "Quick one: {expression} = ?", "Please compute {expression}.",
              "Work this out: {expression}.", "What is the answer to {expression}?"),
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
