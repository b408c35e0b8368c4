"""The built-in task: a fictional world that can only be known through the search tool.

``build_world(seed)`` invents people, organisations and cities with syllable-built names (a few
BPE tokens each, no two within edit distance 1), writes one short document per entity with each
fact after a cue word ("(born–died)", "from", "based in", "founded in", "by"), and partitions
the entities into train/dev/test so that no entity of one split appears in another split's
questions. Questions need 1-3 searches (the query is always
an entity name copied from the question or from a result) and sometimes a one-line python
computation (differences of years, sums of quantities). With ``search_noise`` a search sometimes
returns another entity's page (:class:`SearchNoise`). Teacher demonstrations are scripted
trajectories in the release's tag protocol (§1.1) whose tool results come from running the
task's own tools; a share ``teacher_error_rate`` carries a deliberate error so cold-start SFT
leaves headroom for RL (§5), and each gets fresh invented names so that SFT learns to copy names
rather than remember them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from aepo_rl.config import TaskConfig
from aepo_rl.protocol import Protocol
from aepo_rl.registry import register_corpus
from aepo_rl.rewards import extract_answer, get_reward, is_exact_match
from aepo_rl.tasks.base import Demonstration, Example
from aepo_rl.tasks.common import (
    SYSTEM_PROMPT,
    ToolOptions,
    build_tools,
    chat_messages,
    check_sandbox,
    split_examples,
    system_prompt,
)
from aepo_rl.tools.base import Tool
from aepo_rl.tools.search import Hit

SPLITS = ("train", "dev", "test")
DEFAULT_QUESTIONS = {"train": 512, "dev": 64, "test": 256}
_TEACHER_THREADS = 8  # concurrent tool calls while writing demonstrations (the sandbox bounds its own pool)

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "st", "th"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "s", "m"]
_OCCUPATIONS = ["chemist", "painter", "sailor", "judge", "poet", "engineer", "farmer", "doctor", "merchant", "teacher"]
_ORG_KINDS = ["Guild", "Bank", "Press", "Institute", "Company", "Brewery", "Shipyard", "Theatre"]


# ---------------------------------------------------------------- the world

@dataclass
class Person:
    name: str
    occupation: str
    born: int
    died: int
    birthplace: str


@dataclass
class Organization:
    name: str
    kind: str
    founded: int
    founder: str
    city: str
    employees: int


@dataclass
class City:
    name: str
    founded: int
    population: int


@dataclass
class World:
    """Entities by name, the split each belongs to, and the corpus ({"id", "title", "text"} per doc)."""

    people: dict[str, Person] = field(default_factory=dict)
    orgs: dict[str, Organization] = field(default_factory=dict)
    cities: dict[str, City] = field(default_factory=dict)
    split_of: dict[str, str] = field(default_factory=dict)
    corpus: list[dict] = field(default_factory=list)

    def pool(self, kind: str, split: str) -> list[str]:
        """Names of one kind ("person", "org", "city") in a split, in creation order."""
        table = {"person": self.people, "org": self.orgs, "city": self.cities}[kind]
        return [name for name in table if self.split_of[name] == split]


def _syllable_word(rng: random.Random) -> str:
    """A capitalised word of two (80%) or three syllables."""
    syllables = 2 if rng.random() < 0.8 else 3
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(syllables)).capitalize()


class _NameMaker:
    """Capitalised syllable words; a new word is never within edit distance 1 of an earlier one."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.keys: set[str] = set()

    @staticmethod
    def _deletion_keys(word: str) -> set[str]:
        # Two words within Levenshtein distance 1 share a key of this set.
        return {word} | {word[:i] + "*" + word[i + 1:] for i in range(len(word))} | \
               {word[:i] + word[i + 1:] for i in range(len(word))}

    def word(self) -> str:
        while True:
            word = _syllable_word(self.rng)
            keys = self._deletion_keys(word.lower())
            if 4 <= len(word) <= 9 and not keys & self.keys:
                self.keys |= keys
                return word


def _pool_sizes(num_questions: int) -> dict[str, int]:
    return {"city": max(8, num_questions // 4), "person": max(24, num_questions), "org": max(12, num_questions // 2)}


def build_world(seed: int = 0, num_questions: dict[str, int] | None = None) -> World:
    """The fictional world of ``seed``: entities per split (sized for ``num_questions`` per split) and the corpus."""
    num_questions = {**DEFAULT_QUESTIONS, **(num_questions or {})}
    rng = random.Random(f"world-{seed}")
    names = _NameMaker(rng)
    world = World()
    for split in SPLITS:
        sizes = _pool_sizes(num_questions[split])
        cities = [City(names.word(), rng.randint(900, 1700), rng.randint(1200, 98000)) for _ in range(sizes["city"])]
        people = []
        for _ in range(sizes["person"]):
            born = rng.randint(1700, 1930)
            people.append(Person(f"{names.word()} {names.word()}", rng.choice(_OCCUPATIONS), born,
                                 born + rng.randint(35, 90), rng.choice(cities).name))
        founders = rng.sample(people, sizes["org"])
        orgs = [Organization(f"{names.word()} {kind}", kind.lower(), f.born + rng.randint(20, 60), f.name,
                             rng.choice(cities).name, rng.randint(12, 4800))
                for f in founders for kind in [rng.choice(_ORG_KINDS)]]
        for table, items in ((world.cities, cities), (world.people, people), (world.orgs, orgs)):
            for item in items:
                table[item.name] = item
                world.split_of[item.name] = split
    docs = [(p.name, _person_text(p)) for p in world.people.values()]
    docs += [(o.name, _org_text(o)) for o in world.orgs.values()]
    docs += [(c.name, _city_text(c)) for c in world.cities.values()]
    rng.shuffle(docs)
    world.corpus = [{"id": f"doc{i}", "title": title, "text": text} for i, (title, text) in enumerate(docs)]
    return world


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _person_text(p: Person) -> str:
    return f"{p.name} ({p.born}–{p.died}) was {_a(p.occupation)} from {p.birthplace}."


def _org_text(o: Organization) -> str:
    return (f"{o.name} is {_a(o.kind)} based in {o.city}, founded in {o.founded} by {o.founder}. "
            f"It has {o.employees} employees.")


def _city_text(c: City) -> str:
    return f"{c.name} is a city founded in {c.founded}, with {c.population} inhabitants."


@register_corpus("synthetic")
def synthetic_corpus(seed: int = 0) -> list[dict]:
    """The documents of the world of ``seed``: what the search tool indexes for ``corpus="synthetic"``
    (``aepo serve-search --corpus synthetic``)."""
    return build_world(seed).corpus


# ---------------------------------------------------------------- noisy search

class SearchNoise:
    """The search tool's ``perturb`` under ``task.search_noise`` = p: with probability p the top page
    is replaced by the page of another entity of the same kind (person, organisation or city) from
    the same split. Whether and by which page is a hash of the task seed and the query (lower-cased,
    spaces squeezed), so a run, an evaluation and a retried identical query see the same page; a
    reformulated query is a fresh draw. Pages that are no entity's are left as they are."""

    def __init__(self, world: World, p: float, seed: int):
        self.world, self.p, self.seed = world, p, seed
        self.docs = {d["title"]: d for d in world.corpus}
        self.kinds = {**dict.fromkeys(world.people, "person"), **dict.fromkeys(world.orgs, "org"),
                      **dict.fromkeys(world.cities, "city")}

    def __call__(self, query: str, hits: list[Hit]) -> list[Hit]:
        kind = self.kinds.get(hits[0].title) if hits else None
        if kind is None:
            return hits
        digest = hashlib.sha256(f"search-noise-{self.seed}-{' '.join(query.lower().split())}".encode()).digest()
        if int.from_bytes(digest[:8], "big") / 2**64 >= self.p:
            return hits
        pool = [n for n in self.world.pool(kind, self.world.split_of[hits[0].title]) if n != hits[0].title]
        doc = self.docs[pool[int.from_bytes(digest[8:16], "big") % len(pool)]]
        return [Hit(doc["id"], doc["title"], doc["text"], hits[0].score), *hits[1:]]


# ---------------------------------------------------------------- questions

@dataclass
class Solution:
    """How the teacher answers: the searches in order, an optional python expression, the answer."""

    queries: list[str]
    python: str | None
    answer: str


@dataclass
class QuestionTemplate:
    name: str
    hops: int
    """Searches the question needs."""
    roots: tuple[str, ...]
    """Kinds of the entities named in the question."""
    phrasings: tuple[str, ...]
    solve: Callable[[World, list[str]], Solution]

    @property
    def arithmetic(self) -> bool:
        return self.name.startswith("calc_")


def _lookup(w: World, *chain: str) -> Solution:
    """Follow a chain of attributes from a root entity, searching every entity on the way."""
    queries, name, value = [], chain[0], None
    for attr in chain[1:]:
        queries.append(name)
        entity = w.people.get(name) or w.orgs.get(name) or w.cities[name]
        value = getattr(entity, attr)
        name = value
    return Solution(queries, None, str(value))


def _difference(queries: list[str], left: int, right: int) -> Solution:
    big, small = max(left, right), min(left, right)
    return Solution(queries, f"{big} - {small}", str(big - small))


def _total(queries: list[str], left: int, right: int) -> Solution:
    return Solution(queries, f"{left} + {right}", str(left + right))


def _founder_age(w: World, r: list[str]) -> Solution:
    org = w.orgs[r[0]]
    return _difference([org.name, org.founder], org.founded, w.people[org.founder].born)


TEMPLATES: list[QuestionTemplate] = [
    QuestionTemplate("born", 1, ("person",), ("In which year was {0} born?", "When was {0} born?"),
                     lambda w, r: _lookup(w, r[0], "born")),
    QuestionTemplate("died", 1, ("person",), ("In which year did {0} die?", "When did {0} die?"),
                     lambda w, r: _lookup(w, r[0], "died")),
    QuestionTemplate("birthplace", 1, ("person",), ("Where was {0} born?", "In which city was {0} born?"),
                     lambda w, r: _lookup(w, r[0], "birthplace")),
    QuestionTemplate("founder", 1, ("org",), ("Who founded {0}?", "Who was the founder of {0}?"),
                     lambda w, r: _lookup(w, r[0], "founder")),
    QuestionTemplate("org_founded", 1, ("org",), ("In which year was {0} founded?", "When was {0} founded?"),
                     lambda w, r: _lookup(w, r[0], "founded")),
    QuestionTemplate("org_city", 1, ("org",), ("In which city is {0} based?", "Where is {0} based?"),
                     lambda w, r: _lookup(w, r[0], "city")),
    QuestionTemplate("employees", 1, ("org",), ("How many employees does {0} have?", "How many people work at {0}?"),
                     lambda w, r: _lookup(w, r[0], "employees")),
    QuestionTemplate("population", 1, ("city",), ("What is the population of {0}?", "How many people live in {0}?"),
                     lambda w, r: _lookup(w, r[0], "population")),
    QuestionTemplate("city_founded", 1, ("city",),
                     ("In which year was {0} founded?", "When was the city of {0} founded?"),
                     lambda w, r: _lookup(w, r[0], "founded")),
    QuestionTemplate("founder_birthplace", 2, ("org",), ("Where was the founder of {0} born?",
                                                         "In which city was the founder of {0} born?"),
                     lambda w, r: _lookup(w, r[0], "founder", "birthplace")),
    QuestionTemplate("founder_born", 2, ("org",), ("In which year was the founder of {0} born?",
                                                   "When was the founder of {0} born?"),
                     lambda w, r: _lookup(w, r[0], "founder", "born")),
    QuestionTemplate("org_city_population", 2, ("org",), ("What is the population of the city where {0} is based?",
                                                          "How many people live in the city where {0} is based?"),
                     lambda w, r: _lookup(w, r[0], "city", "population")),
    QuestionTemplate("birthplace_founded", 2, ("person",), ("In which year was the birthplace of {0} founded?",
                                                            "When was the city where {0} was born founded?"),
                     lambda w, r: _lookup(w, r[0], "birthplace", "founded")),
    QuestionTemplate("birthplace_population", 2, ("person",), ("What is the population of the birthplace of {0}?",
                                                               "How many people live in the city where {0} was born?"),
                     lambda w, r: _lookup(w, r[0], "birthplace", "population")),
    QuestionTemplate("founder_birthplace_population", 3, ("org",),
                     ("What is the population of the birthplace of the founder of {0}?",
                      "How many people live in the city where the founder of {0} was born?"),
                     lambda w, r: _lookup(w, r[0], "founder", "birthplace", "population")),
    QuestionTemplate("founder_birthplace_founded", 3, ("org",),
                     ("In which year was the birthplace of the founder of {0} founded?",
                      "When was the city where the founder of {0} was born founded?"),
                     lambda w, r: _lookup(w, r[0], "founder", "birthplace", "founded")),
    QuestionTemplate("calc_lifespan", 1, ("person",), ("How many years did {0} live?",
                                                       "How old was {0} when they died?"),
                     lambda w, r: _difference([r[0]], w.people[r[0]].died, w.people[r[0]].born)),
    QuestionTemplate("calc_founder_age", 2, ("org",), ("How old was the founder of {0} when it was founded?",
                                                       "How old was the founder of {0} when they founded it?"),
                     _founder_age),
    QuestionTemplate("calc_employees_total", 2, ("org", "org"),
                     ("How many employees do {0} and {1} have together?",
                      "How many people work at {0} and {1} combined?"),
                     lambda w, r: _total(r, w.orgs[r[0]].employees, w.orgs[r[1]].employees)),
    QuestionTemplate("calc_population_total", 2, ("city", "city"),
                     ("What is the combined population of {0} and {1}?",
                      "How many people live in {0} and {1} together?"),
                     lambda w, r: _total(r, w.cities[r[0]].population, w.cities[r[1]].population)),
    QuestionTemplate("calc_birth_gap", 2, ("person", "person"),
                     ("How many years apart were {0} and {1} born?",
                      "How many years separate the births of {0} and {1}?"),
                     lambda w, r: _difference(r, w.people[r[0]].born, w.people[r[1]].born)),
]
_TEMPLATES = {t.name: t for t in TEMPLATES}


def make_questions(world: World, split: str, count: int, rng: random.Random, max_hops: int,
                   arithmetic_fraction: float, system: str = SYSTEM_PROMPT, min_hops: int = 1) -> list[Example]:
    """``count`` distinct questions about the entities of ``split``, each after the system message ``system``.

    Each question is arithmetic with probability ``arithmetic_fraction``; its hop level is drawn
    uniformly from the levels (``min_hops``..``max_hops``) that have templates of that kind.
    ``extra_info`` holds its ``hops`` and ``min_tool_calls``: the calls of the teacher's solution
    (its searches and python call), the fewest that answer it.
    """
    by_level: dict[tuple[bool, int], list[QuestionTemplate]] = {}
    for t in TEMPLATES:
        if min_hops <= t.hops <= max_hops:
            by_level.setdefault((t.arithmetic, t.hops), []).append(t)
    for arithmetic, share in ((True, arithmetic_fraction), (False, 1 - arithmetic_fraction)):
        if share > 0 and not any(a == arithmetic for a, _ in by_level):
            kind = "arithmetic questions need 1-2 searches" if arithmetic else "questions need 1-3 searches"
            raise ValueError(f"task.min_hops={min_hops}, task.max_hops={max_hops}: no question template in that range "
                             f"({kind}); widen the range or set task.arithmetic_fraction={int(not arithmetic)}")
    examples, seen = [], set()
    for _ in range(100 * count + 1000):
        if len(examples) == count:
            return examples
        arithmetic = rng.random() < arithmetic_fraction
        levels = sorted(h for (a, h) in by_level if a == arithmetic)
        template = rng.choice(by_level[(arithmetic, rng.choice(levels))])
        roots: list[str] = []
        for kind in template.roots:
            roots.append(rng.choice([n for n in world.pool(kind, split) if n not in roots]))
        question = rng.choice(template.phrasings).format(*roots)
        if question in seen:
            continue
        seen.add(question)
        solution = template.solve(world, roots)
        examples.append(Example(
            id=f"synthetic-{split}-{len(examples)}", question=question, answers=[solution.answer],
            data_source="synthetic", messages=chat_messages(question, system),
            extra_info={"split": split, "template": template.name, "hops": template.hops,
                        "arithmetic": template.arithmetic, "roots": roots,
                        "entities": _chain_entities(world, solution),
                        "min_tool_calls": len(solution.queries) + (solution.python is not None)}))
    raise ValueError(f"cannot draw {count} distinct {split} questions from {len(world.pool('person', split))} "
                     f"people with hops {min_hops}-{max_hops}, arithmetic_fraction={arithmetic_fraction}: ask "
                     "for fewer questions or allow more hops / a mixed arithmetic share")


def _chain_entities(world: World, solution: Solution) -> list[str]:
    """Every entity a question touches: the searched ones and an entity-valued answer."""
    answer = [solution.answer] if solution.answer in world.split_of else []
    return list(dict.fromkeys(solution.queries + answer))


# ---------------------------------------------------------------- the teacher

ERROR_KINDS = ("wrong_query", "skipped_search", "arithmetic_slip")


def _wrong_query(world: World, example: Example, rng: random.Random) -> Solution:
    """The teacher searches for another entity of the same kind and follows it consistently."""
    template = _TEMPLATES[example.extra_info["template"]]
    roots = list(example.extra_info["roots"])
    i = rng.randrange(len(roots))
    pool = [n for n in world.pool(template.roots[i], example.extra_info["split"]) if n not in roots]
    roots[i] = rng.choice(pool)
    return template.solve(world, roots)


def _guess(world: World, example: Example, rng: random.Random) -> Solution:
    """The teacher skips the search and guesses an answer of the right kind."""
    gold, split = example.answers[0], example.extra_info["split"]
    if gold in world.people:
        guess = rng.choice(world.pool("person", split))
    elif gold in world.cities:
        guess = rng.choice(world.pool("city", split))
    else:
        guess = str(int(gold) + rng.choice([-1, 1]) * rng.randint(1, 40))
    return Solution([], None, guess)


def _slip(world: World, example: Example, rng: random.Random) -> Solution:
    """The teacher searches correctly but mistypes a number in its python call."""
    right = _TEMPLATES[example.extra_info["template"]].solve(world, example.extra_info["roots"])
    left, op, operand = right.python.split(" ")
    wrong = int(operand) + rng.choice([-1, 1]) * rng.randint(1, 9)
    value = int(left) - wrong if op == "-" else int(left) + wrong
    return Solution(right.queries, f"{left} {op} {wrong}", str(value))


_MISTAKES = {"wrong_query": _wrong_query, "skipped_search": _guess, "arithmetic_slip": _slip}


RETRY_WORDS = ("profile", "record", "entry")
"""Words the teacher appends to a search query whose result is not the searched entity's page
(:class:`SearchNoise`), one more attempt per word; none occurs in the corpus, so BM25 ranks alike."""


def _shows_page(result: str, title: str) -> bool:
    """Whether a search result (``Page i: title — text`` lines) has the page titled ``title``."""
    return re.search(rf"^Page \d+: {re.escape(title)} — ", result, re.MULTILINE) is not None


def teacher_pieces(solution: Solution, tools: dict[str, Tool], fmt: str = "xml",
                   retry_words: tuple[str, ...] = ()) -> list[tuple[str, bool]]:
    """A trajectory in the tool protocol (§1.1) of format ``fmt``, tool results from running ``tools``.

    Model pieces (trained) and result blocks (not trained) alternate; the final answer of an
    arithmetic solution is the python tool's own output. When a search returns another entity's
    page (search noise), the teacher searches again with the next of ``retry_words`` appended
    (:data:`RETRY_WORDS`: ``<search> Vela Korr profile</search>``) until the page is the searched
    one; after the last word it goes on with its plan. A copied value is written after a space,
    as in running text (``<search> Vela Korr</search>``, ``\\boxed{ 1874}``), so copying it from
    the question or a result is the same tokens (the search and the answer check strip it).
    Hermes results are ChatML user turns, as the rollout writes them for a tokenizer with the
    ChatML tokens (the tiny tokenizer, SmolLM2, Qwen).
    """
    protocol = Protocol(tools, fmt)
    pieces: list[tuple[str, bool]] = []
    answer = solution.answer
    calls = [("search", q) for q in solution.queries] + ([("python", solution.python)] if solution.python else [])
    for tag, arg in calls:
        attempts = [arg, *(f"{arg} {word}" for word in retry_words)] if tag == "search" else [arg]
        for attempt in attempts:
            call = protocol.format_call(tag, f" {attempt}" if tag == "search" else attempt)
            pieces.append((f"{' ' if pieces else ''}{call}", True))
            output = tools[tag].run(attempt)
            pieces.append((protocol.format_result(output, chatml=True), False))
            if tag != "search" or _shows_page(output, arg):
                break
        if tag == "python":
            answer = output.strip()
    pieces.append((f"{' ' if pieces else ''}{protocol.format_answer(f' {answer}')}", True))
    return pieces


class TeacherPython:
    """The python tool as the teacher's programs see it, without a sandbox.

    Every program the teacher writes is one sum or difference of two integers (``"1981 - 1892"``;
    an arithmetic slip changes an operand), and the sandbox reports such a program as its printed
    value. Computing that value here spares the ~600 sandboxed interpreters a task's
    demonstrations would start (about 30 s on 2 CPU cores); any other program goes to ``tool``,
    as do the tool's attributes. ``tests/test_synthetic.py`` runs the teacher's programs of every
    kind through the sandbox too and compares the texts."""

    _PROGRAM = re.compile(r"(-?\d+) ([+-]) (-?\d+)")

    def __init__(self, tool: Tool):
        self.tool = tool

    def __getattr__(self, name: str):
        return getattr(self.tool, name)

    def run(self, code: str) -> str:
        program = self._PROGRAM.fullmatch(code)
        if program is None:
            return self.tool.run(code)
        left, op, right = program.groups()
        return str(int(left) + int(right) if op == "+" else int(left) - int(right))


def teacher_tools(tools: dict[str, Tool]) -> dict[str, Tool]:
    """``tools`` with the python tool answering the teacher's programs directly (:class:`TeacherPython`)."""
    return {name: TeacherPython(tool) if name == "python" else tool for name, tool in tools.items()}


def name_words(world: World) -> set[str]:
    """The words of the world's entity names: people and cities whole, organisations without
    their kind ("Guild", "Bank")."""
    return ({w for name in [*world.people, *world.cities] for w in name.split()}
            | {name.split()[0] for name in world.orgs})


def renamed(demo: Demonstration, names: re.Pattern, new_name: Callable[[str], str],
            info_keys: tuple[str, ...] = ("roots", "entities")) -> Demonstration:
    """``demo`` with each distinct match of ``names`` replaced by one ``new_name(match)`` throughout: question,
    messages, answers, pieces and the name lists ``info_keys`` of its ``extra_info``."""
    fresh: dict[str, str] = {}

    def rename(text: str) -> str:
        return names.sub(lambda m: fresh.setdefault(m.group(0), new_name(m.group(0))), text)

    ex = demo.example
    info = {**ex.extra_info, **{key: [rename(name) for name in ex.extra_info[key]] for key in info_keys}}
    example = dataclasses.replace(ex, question=rename(ex.question), answers=[rename(a) for a in ex.answers],
                                  messages=[{**m, "content": rename(m["content"])} for m in ex.messages],
                                  extra_info=info)
    return Demonstration(example, [(rename(text), trained) for text, trained in demo.pieces], demo.has_error)


def _renamed(demo: Demonstration, names: re.Pattern, rng: random.Random) -> Demonstration:
    """``demo`` with each distinct name word replaced by one fresh invented word throughout."""
    return renamed(demo, names, lambda _: _syllable_word(rng))


# ---------------------------------------------------------------- the task

class SyntheticTask:
    """The built-in task (``task.name=synthetic``): tools are necessary, answers are unguessable."""

    name = "synthetic"

    def __init__(self, task_cfg: TaskConfig, tools: dict[str, Tool] | None = None,
                 tool_options: ToolOptions | None = None):
        self.cfg, self.tool_options = task_cfg, tool_options
        if tools is None:
            check_sandbox(("search", "python"), tool_options)
        self.tool_format = tool_options.tool_format if tool_options else "xml"
        self.system = system_prompt(("search", "python"), self.tool_format)
        counts = {"train": task_cfg.num_train, "dev": task_cfg.num_dev, "test": task_cfg.num_test}
        self.world = build_world(task_cfg.seed, counts)
        self._examples = {
            split: make_questions(self.world, split, counts[split], random.Random(f"questions-{task_cfg.seed}-{split}"),
                                  task_cfg.max_hops, task_cfg.arithmetic_fraction, self.system, task_cfg.min_hops)
            for split in SPLITS}
        self._tools = tools
        self._demos: list[Demonstration] | None = None
        self._reward = get_reward(task_cfg.reward, judge_url=task_cfg.judge_url, judge_model=task_cfg.judge_model)

    def examples(self, split: str) -> list[Example]:
        return split_examples(self.name, self._examples, split)

    def tools(self) -> dict[str, Tool]:
        if self._tools is None:
            noise = SearchNoise(self.world, self.cfg.search_noise, self.cfg.seed) if self.cfg.search_noise else None
            self._tools = build_tools(self.cfg, corpus=self.world.corpus, options=self.tool_options,
                                      search_perturb=noise)
        return self._tools

    def reward(self, example: Example, response_text: str) -> float:
        return self._reward(response_text, example.answers, example.question)

    def correct(self, example: Example, response_text: str) -> bool:
        r"""The boxed answer equals a gold answer after normalisation."""
        return is_exact_match(extract_answer(response_text), example.answers)

    def demonstrations(self) -> list[Demonstration]:
        """``num_demonstrations`` teacher trajectories on fresh train-split questions; exactly
        round(teacher_error_rate · N) of them carry an error (wrong query, skipped search, or an
        arithmetic slip for arithmetic questions), and every one of those gets a wrong answer.
        The plans are drawn in order (deterministic); the tool calls run concurrently.

        Every name word of a demonstration is then replaced by a fresh invented word, the same
        one throughout that demonstration (question, queries, results, answer): the facts stay
        as the tools returned them, but no name recurs across demonstrations, so SFT cannot learn
        names by heart and has to learn to copy them (the held-out names of dev/test are new).
        Under ``search_noise`` the teacher searches again when a page is not the searched entity's
        (:func:`teacher_pieces`), so an error-free demonstration stays correct."""
        if self._demos is None:
            cfg, rng = self.cfg, random.Random(f"teacher-{self.cfg.seed}")
            questions = make_questions(self.world, "train", cfg.num_demonstrations, rng, cfg.max_hops,
                                       cfg.arithmetic_fraction, self.system, cfg.min_hops)
            flawed = set(rng.sample(range(len(questions)), round(cfg.teacher_error_rate * len(questions))))
            plans = [self._plan(ex, i in flawed, rng) for i, ex in enumerate(questions)]
            tools = teacher_tools(self.tools())
            with ThreadPoolExecutor(_TEACHER_THREADS) as pool:
                pieces = list(pool.map(lambda solution: self._teacher_pieces(solution, tools), plans))
            names = random.Random(f"renames-{cfg.seed}")
            self._demos = [_renamed(Demonstration(ex, p, has_error=i in flawed), self.name_pattern, names)
                           for i, (ex, p) in enumerate(zip(questions, pieces))]
        return self._demos

    def demonstrations_for(self, split: str) -> list[Demonstration]:
        """Error-free teacher trajectories for every question of ``split`` (e.g. held-out SFT metrics)."""
        tools = teacher_tools(self.tools())
        with ThreadPoolExecutor(_TEACHER_THREADS) as pool:
            return list(pool.map(lambda ex: Demonstration(ex, self._teacher_pieces(self._plan(ex, False, None), tools)),
                                 self.examples(split)))

    def _teacher_pieces(self, solution: Solution, tools: dict[str, Tool]) -> list[tuple[str, bool]]:
        """:func:`teacher_pieces` in the task's tool format; with search noise the teacher retries wrong pages."""
        return teacher_pieces(solution, tools, self.tool_format, RETRY_WORDS if self.cfg.search_noise else ())

    def _plan(self, example: Example, flawed: bool, rng: random.Random | None) -> Solution:
        """The teacher's solution; a flawed one is redrawn until its answer is wrong."""
        template = _TEMPLATES[example.extra_info["template"]]
        if not flawed:
            return template.solve(self.world, example.extra_info["roots"])
        kinds = ERROR_KINDS if template.arithmetic else ERROR_KINDS[:2]
        while True:
            solution = _MISTAKES[rng.choice(kinds)](self.world, example, rng)
            if not is_exact_match(solution.answer, example.answers):
                return solution

    def texts(self) -> list[str]:
        """Train-side text (train prompts and documents, demonstrations) for the tokenizer, with
        every name word replaced by a fresh random one at each occurrence: no entity is frequent
        enough to become a token, so train and test names alike split into syllable pieces and a
        model that learns to copy names on the train split copies unseen ones too. The system
        prompt recurs with every prompt, so it compresses to few tokens."""
        train_docs = [f"{d['title']}\n{d['text']}" for d in self.world.corpus
                      if self.world.split_of[d["title"]] == "train"]
        demos = ["".join(text for text, _ in d.pieces) for d in self.demonstrations()]
        prompts = [m["content"] for e in self.examples("train") for m in e.messages]  # system prompt included
        rng = random.Random(f"tokenizer-{self.cfg.seed}")
        return [self.name_pattern.sub(lambda _: _syllable_word(rng), text) for text in [*prompts, *train_docs, *demos]]

    @functools.cached_property
    def name_pattern(self) -> re.Pattern:
        """Any word of an entity name (:func:`name_words`), as a whole word."""
        return re.compile(r"\b(?:" + "|".join(sorted(name_words(self.world), key=len, reverse=True)) + r")\b")
