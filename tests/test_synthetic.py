"""The built-in synthetic task: determinism, disjoint splits, searchability, teacher demonstrations."""

import itertools
import random
import re

import pytest

from aepo_rl.config import ConfigError, TaskConfig, load_config
from aepo_rl.tasks import get_task
from aepo_rl.tasks.common import SYSTEM_PROMPT
from aepo_rl.tasks.synthetic import RETRY_WORDS, TEMPLATES, SyntheticTask, build_world, make_questions, teacher_tools
from aepo_rl.tools import get_tool

SMALL = dict(num_train=40, num_dev=24, num_test=24, num_demonstrations=40)


def small_task(**overrides) -> SyntheticTask:
    return SyntheticTask(TaskConfig(**{**SMALL, **overrides}))


def response(demo) -> str:
    return "".join(text for text, _ in demo.pieces)


@pytest.fixture(scope="module")
def task():
    return small_task(teacher_error_rate=0.0, max_hops=3, arithmetic_fraction=0.4)


def test_world_is_deterministic_by_seed():
    assert build_world(3).corpus == build_world(3).corpus
    assert build_world(3).corpus != build_world(4).corpus
    a, b = small_task(seed=5), small_task(seed=5)
    for split in ("train", "dev", "test"):
        assert ([(e.question, e.answers) for e in a.examples(split)]
                == [(e.question, e.answers) for e in b.examples(split)])
    assert small_task(seed=6).examples("test")[0].question != a.examples("test")[0].question


def test_corpus_has_one_short_document_per_entity_titled_by_name():
    world = build_world(0)
    titles = [d["title"] for d in world.corpus]
    assert len(titles) == len(set(titles)) == len(world.people) + len(world.orgs) + len(world.cities)
    assert all(d.keys() == {"id", "title", "text"} and d["title"] in d["text"] for d in world.corpus)
    assert max(len(d["text"].split()) for d in world.corpus) <= 25


def _edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def entity_name_words(world) -> set[str]:
    """Every word of the entities' names (one document per entity, titled by its name), org kinds excepted."""
    kinds = {"Guild", "Bank", "Press", "Institute", "Company", "Brewery", "Shipyard", "Theatre"}
    return {w for d in world.corpus for w in d["title"].split() if w not in kinds}


def test_name_words_are_never_near_duplicates():
    world = build_world(1, {"train": 24, "dev": 8, "test": 8})
    words = entity_name_words(world)
    assert len(words) > 100
    assert min(_edit_distance(a.lower(), b.lower()) for a, b in itertools.combinations(sorted(words), 2)) >= 2


def test_splits_share_no_entity(task):
    entities = {split: {n for e in task.examples(split) for n in e.extra_info["entities"]}
                for split in ("train", "dev", "test")}
    assert all(entities.values())
    for a, b in itertools.combinations(entities, 2):
        assert not entities[a] & entities[b], (a, b)
    for split, names in entities.items():
        assert {task.world.split_of[n] for n in names} == {split}


def test_questions_have_messages_and_unique_text(task):
    examples = task.examples("test")
    assert len(examples) == 24 and len({e.question for e in examples}) == 24
    e = examples[0]
    assert e.messages == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": e.question}]
    assert e.data_source == "synthetic" and e.id == "synthetic-test-0"


def test_difficulty_knobs():
    world = build_world(0)
    one_hop = make_questions(world, "dev", 60, random.Random(0), max_hops=1, arithmetic_fraction=0.0)
    assert {e.extra_info["hops"] for e in one_hop} == {1} and not any(e.extra_info["arithmetic"] for e in one_hop)
    arithmetic = make_questions(world, "dev", 60, random.Random(0), max_hops=3, arithmetic_fraction=1.0)
    assert all(e.extra_info["arithmetic"] for e in arithmetic)
    deep = make_questions(world, "dev", 60, random.Random(0), max_hops=3, arithmetic_fraction=0.0)
    assert {e.extra_info["hops"] for e in deep} == {1, 2, 3}


def test_min_hops_draws_questions_from_min_to_max_hops():
    world = build_world(0)
    questions = make_questions(world, "dev", 60, random.Random(0), max_hops=3, arithmetic_fraction=0.4, min_hops=2)
    assert {e.extra_info["hops"] for e in questions} == {2, 3}
    assert {e.extra_info["hops"] for e in questions if e.extra_info["arithmetic"]} == {2}  # arithmetic: 1-2 hops
    task = small_task(min_hops=2, max_hops=3, num_demonstrations=30)
    assert min(d.example.extra_info["hops"] for d in task.demonstrations()) == 2
    assert min(e.extra_info["hops"] for e in task.examples("test")) == 2


def test_min_hops_above_max_hops_or_leaving_no_template_fails_naming_the_keys():
    with pytest.raises(ConfigError, match=r"task.min_hops=3 must be <= task.max_hops=2"):
        load_config(overrides={"task.min_hops": 3, "task.max_hops": 2})
    with pytest.raises(ValueError, match=r"task.min_hops=3.*arithmetic questions need 1-2.*task.arithmetic_fraction=0"):
        small_task(min_hops=3, max_hops=3, arithmetic_fraction=0.3)
    dev = small_task(min_hops=3, max_hops=3, arithmetic_fraction=0).examples("dev")
    assert {e.extra_info["hops"] for e in dev} == {3}


def test_min_tool_calls_counts_the_teachers_calls(task):
    """extra_info["min_tool_calls"]: the searches and python call of the error-free teacher's trajectory."""
    for demo in task.demonstrations_for("dev"):
        text = response(demo)
        assert demo.example.extra_info["min_tool_calls"] == text.count("<search>") + text.count("<python>")
    assert {e.extra_info["min_tool_calls"] for e in task.examples("test")} == {1, 2, 3}


def test_search_noise_returns_another_page_of_the_same_kind_deterministically():
    noisy, clean = small_task(search_noise=0.3), small_task()
    world = noisy.world
    names = [n for kind in ("person", "org", "city") for split in ("train", "test") for n in world.pool(kind, split)]
    results = [noisy.tools()["search"].run(n) for n in names]
    wrong = {n: r for n, r in zip(names, results) if not r.startswith(f"Page 1: {n} — ")}
    assert 0.2 <= len(wrong) / len(names) <= 0.4, len(wrong) / len(names)
    kind = {**dict.fromkeys(world.people, "p"), **dict.fromkeys(world.orgs, "o"), **dict.fromkeys(world.cities, "c")}
    for name, result in wrong.items():
        title = result.removeprefix("Page 1: ").split(" — ")[0]
        assert title != name and kind[title] == kind[name] and world.split_of[title] == world.split_of[name]
    assert all(clean.tools()["search"].run(n).startswith(f"Page 1: {n} — ") for n in wrong)  # noise 0: the right page
    again = small_task(search_noise=0.3).tools()["search"]  # a fresh tool: same seed and query, same page
    assert [again.run(n) for n in names] == results
    assert [again.run(f"  {n.lower()} ") for n in wrong] == list(wrong.values())
    other_seed = small_task(search_noise=0.3, seed=1)
    other = [n for kind in ("person", "org", "city") for n in other_seed.world.pool(kind, "train")]
    assert sum(not other_seed.tools()["search"].run(n).startswith(f"Page 1: {n} — ") for n in other) > 0


def test_teacher_recovers_from_search_noise_by_searching_again():
    task = small_task(search_noise=0.3, max_hops=3, teacher_error_rate=0.0, num_demonstrations=60)
    corpus_words = {w.lower() for d in task.world.corpus for w in re.findall(r"\w+", d["title"] + " " + d["text"])}
    assert not corpus_words & set(RETRY_WORDS)  # a retry word changes the noise draw, not BM25's ranking

    def parts(query: str) -> tuple[str, int]:  # the searched name, and which retry (-1: the first search)
        name, _, word = query.rpartition(" ")
        return (name, RETRY_WORDS.index(word)) if word in RETRY_WORDS else (query, -1)

    retried = 0
    for demo in [*task.demonstrations(), *task.demonstrations_for("dev")]:
        text = response(demo)
        assert task.correct(demo.example, text), text
        searches = [(parts(call.strip()[len("<search> "):-len("</search>")]),
                     result.split("Page 1: ")[1].split(" — ")[0])
                    for (call, _), (result, _) in zip(demo.pieces[0::2], demo.pieces[1::2]) if "<search>" in call]
        for ((name, i), title), ((next_name, j), _) in zip(searches, [*searches[1:], ((None, -1), None)]):
            wrong_page = title != name and i < len(RETRY_WORDS) - 1
            assert (j == i + 1 and next_name == name) if wrong_page else j == -1, searches
        retried += any(i >= 0 for (_, i), _ in searches)
    assert retried >= 10


def test_every_template_answer_follows_from_the_world():
    world = build_world(0)
    org = next(iter(world.orgs.values()))
    founder = world.people[org.founder]
    by_name = {t.name: t for t in TEMPLATES}
    solution = by_name["founder_birthplace_population"].solve(world, [org.name])
    assert solution.queries == [org.name, founder.name, founder.birthplace]
    assert solution.answer == str(world.cities[founder.birthplace].population)
    age = by_name["calc_founder_age"].solve(world, [org.name])
    assert age.python == f"{org.founded} - {founder.born}" and age.answer == str(org.founded - founder.born)


def test_search_finds_the_documents_the_teacher_queries_on_dev(task):
    """recall@5 of the needed document for every hop query the teacher issues: at least 0.95 (top-1: 0.9)."""
    search = get_tool("search", corpus=task.world.corpus, topk=5)
    by_name = {t.name: t for t in TEMPLATES}
    hits = total = top1 = 0
    for e in task.examples("dev"):
        for query in by_name[e.extra_info["template"]].solve(task.world, e.extra_info["roots"]).queries:
            pages = search.run(query).split("\n")
            total += 1
            hits += any(p.startswith(f"Page {i}: {query} — ") for i, p in enumerate(pages, 1))
            top1 += pages[0].startswith(f"Page 1: {query} — ")
    assert total >= 24 and hits / total >= 0.95 and top1 / total >= 0.9


def test_teacher_demonstrations_without_errors_earn_full_reward(task):
    demos = task.demonstrations()
    assert len(demos) == 40 and not any(d.has_error for d in demos)
    assert {d.example.extra_info["split"] for d in demos} == {"train"}
    tools = task.tools()
    for demo in demos:
        text = response(demo)
        both_tools = "</search>" in text and "</python>" in text
        assert task.reward(demo.example, text) == pytest.approx(1.1 if both_tools else 1.0), text
        assert task.correct(demo.example, text)
        trained = [flag for _, flag in demo.pieces]
        assert trained[-1] and trained == [i % 2 == 0 for i in range(len(trained))]
    for demo in task.demonstrations_for("dev"):  # real names: the results are the tools' own output
        assert task.correct(demo.example, response(demo))
        for (call, _), (result, _) in zip(demo.pieces[0::2], demo.pieces[1::2]):
            tag = "search" if "<search>" in call else "python"
            arg = call.strip()[len(tag) + 2:-(len(tag) + 3)]
            assert result == f" <result>\n{tools[tag].run(arg)}\n</result>"  # what the rollout appends


def test_the_teachers_python_results_are_the_sandboxs():
    """The teacher's programs (right and slipped) are answered without the sandbox (TeacherPython);
    the sandbox prints the same text for each, and other code still goes to the sandbox."""
    slips = small_task(teacher_error_rate=1.0, arithmetic_fraction=1.0, num_demonstrations=16)
    sandbox = slips.tools()["python"]
    teacher = teacher_tools(slips.tools())["python"]
    programs = {call.strip()[len("<python>"):-len("</python>")]
                for demo in slips.demonstrations() for call, trained in demo.pieces if trained and "<python>" in call}
    programs |= {"1981 - 1892", "7 + 35", "-4 - -9", "10 - 20"}
    assert len(programs) >= 8
    for code in programs:
        assert teacher.run(code) == sandbox.run(code), code
    assert sandbox.stats["calls"] == len(programs)
    assert teacher.run("print(6 * 7)") == "42" and sandbox.stats["calls"] == len(programs) + 1
    assert (teacher.tag, teacher.description) == (sandbox.tag, sandbox.description)


def test_demonstrations_rename_every_name_consistently(task):
    """Fresh names per demonstration, the same one throughout it; everything else untouched."""
    from aepo_rl.tasks.synthetic import _renamed

    words = entity_name_words(task.world)
    for demo in task.demonstrations_for("dev"):
        new = _renamed(demo, task.name_pattern, random.Random(0))
        before, after = demo.example.question + response(demo), new.example.question + response(new)
        capitalised = r"[A-Z][a-z]+"
        assert re.sub(capitalised, "W", before) == re.sub(capitalised, "W", after)  # numbers, tags, layout
        pairs = set(zip(re.findall(capitalised, before), re.findall(capitalised, after)))
        renamed = {(old, fresh) for old, fresh in pairs if old in words}
        assert renamed and len({o for o, _ in renamed}) == len({f for _, f in renamed}) == len(renamed)  # 1:1
        assert all(old == fresh for old, fresh in pairs - renamed)  # "Page", "Shipyard", "It" stay
        assert new.example.extra_info["roots"][0] in new.example.question
        assert new.example.messages[-1]["content"] == new.example.question
        assert task.correct(new.example, response(new))
    roots = [d.example.extra_info["roots"][0] for d in task.demonstrations()]
    assert len(set(roots)) == len(roots)  # no name recurs across demonstrations
    assert len({w for root in roots for w in root.split()} & words) <= 1  # chance collisions only


def test_teacher_error_rate_is_honoured():
    task = small_task(teacher_error_rate=0.25, arithmetic_fraction=0.5)
    demos = task.demonstrations()
    flawed = [d for d in demos if d.has_error]
    assert len(flawed) == 10
    for demo in flawed:
        assert not task.correct(demo.example, response(demo))
        assert task.reward(demo.example, response(demo)) < 1.0
    assert any(len(d.pieces) == 1 for d in flawed)  # a skipped search answers at once


def test_tokenizer_text_holds_no_entity_name(task):
    """Every name word is replaced by a fresh random word, so no entity can become one token."""
    assert SYSTEM_PROMPT in task.texts()
    text = "\n".join(task.texts())
    words = entity_name_words(task.world)
    found = {w for w in words if re.search(rf"\b{w}\b", text)}
    assert len(found) <= len(words) // 50  # only chance collisions with the fresh random words
    assert " was born?" in text and "<search> " in text  # the language itself is kept


def test_teacher_writes_copied_values_after_a_space(task):
    demo = next(d for d in task.demonstrations() if not d.has_error and d.example.extra_info["hops"] == 1
                and not d.example.extra_info["arithmetic"])
    first, answer = demo.pieces[0][0], demo.pieces[-1][0]
    assert first == f"<search> {demo.example.extra_info['roots'][0]}</search>"
    assert answer.endswith(f"<answer>\\boxed{{ {demo.example.answers[0]}}}</answer>")


def test_get_task_builds_the_synthetic_task():
    cfg = load_config(overrides={f"task.{k}": v for k, v in SMALL.items()})
    task = get_task(cfg)
    assert isinstance(task, SyntheticTask) and len(task.examples("train")) == 40
    with pytest.raises(KeyError, match="splits"):
        task.examples("validation")


def test_asking_for_more_questions_than_exist_fails_clearly():
    world = build_world(0, {"train": 8, "dev": 8, "test": 8})
    with pytest.raises(ValueError, match="cannot draw 500 distinct dev questions"):
        make_questions(world, "dev", 500, random.Random(0), max_hops=1, arithmetic_fraction=1.0)


def test_get_task_passes_cache_dir_and_the_rollouts_tool_limits_to_the_tools(tmp_path, monkeypatch):
    import aepo_rl.tasks.common as common

    calls = {}
    monkeypatch.setattr(common, "get_tool", lambda name, **kwargs: calls.setdefault(name, kwargs))
    cfg = load_config(overrides={**{f"task.{k}": v for k, v in SMALL.items()}, "model.cache_dir": str(tmp_path),
                                 "rollout.tool_timeout": 5.0, "rollout.tool_workers": 3, "rollout.sandbox_write_mb": 5})
    get_task(cfg).tools()
    assert calls["search"]["cache_dir"] == str(tmp_path)
    # timeout 0.8 × tool_timeout: the sandbox reports first
    assert calls["python"] == {"timeout": 4.0, "pool_size": 3, "write_mb": 5, "isolation": "auto"}


def test_hermes_tool_format_writes_prompts_and_demonstrations_in_hermes():
    from aepo_rl.protocol import Protocol
    from aepo_rl.tasks.common import ToolOptions

    cfg = load_config(overrides=["rollout.tool_format=hermes"])
    task = SyntheticTask(TaskConfig(**{**SMALL, "teacher_error_rate": 0.0}), tool_options=ToolOptions.from_config(cfg))
    assert task.tool_format == "hermes"
    system = task.examples("train")[0].messages[0]["content"]
    assert "<tool_call>" in system and "<search>" not in system and system != SYSTEM_PROMPT
    assert all(e.messages[0]["content"] == system for split in ("train", "test") for e in task.examples(split))
    protocol = Protocol(task.tools(), "hermes")
    for demo in task.demonstrations():
        calls, results = demo.pieces[0:-1:2], demo.pieces[1::2]
        for (call, trained), (result, result_trained) in zip(calls, results):
            request = protocol.parse_call(call, "</tool_call>")  # what the rollout parses
            assert trained and not result_trained and request is not None and request.error is None, call
            assert result.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n")
            assert result.endswith("\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
        assert task.correct(demo.example, response(demo)) and "<search>" not in response(demo)
    # the default stays the release's XML tags, byte for byte
    assert small_task().examples("train")[0].messages[0]["content"] == SYSTEM_PROMPT
