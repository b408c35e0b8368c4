"""PhantomWiki as a task: its scores against the package's own, the universes, the teacher, bad input.

Tests that generate universes need SWI-Prolog and phantom-wiki (the [phantomwiki] extra, docs/tasks-and-rewards.md)
and skip with the reason where they are missing; the parity test loads phantom_eval's scorer modules without its
package __init__ (which imports LLM clients) and needs what phantom_eval/utils.py imports at the top: datasets,
joblib, nltk (in [dev] or installed with phantom-wiki's dependencies) and phantom_wiki itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import shutil
import sys
import types
from pathlib import Path

import pytest
from helpers import HAVE_GENERATOR, TINY_UNIVERSES, needs_generator

from aepo_rl.config import load_config
from aepo_rl.errors import UserError
from aepo_rl.rewards import answer_list_scores, get_reward, reward_function
from aepo_rl.tasks import get_task
from aepo_rl.tasks.phantomwiki import INSTALL, PhantomWikiError, name_parts, parse_chain, read_universe

# ---------------------------------------------------------------- scores: equal to phantom_eval's own


@pytest.fixture(scope="module")
def phantom_eval_score(tmp_path_factory):
    """phantom_eval.score with phantom_eval.constants and phantom_eval.utils, loaded from the installed package's
    files under a stub parent package (its __init__ imports openai, anthropic … for its agents)."""
    spec = importlib.util.find_spec("phantom_eval")
    if spec is None:
        pytest.skip("phantom_eval is not installed (it ships with phantom-wiki): " + INSTALL)
    for module in ("datasets", "joblib", "nltk"):  # phantom_eval/utils.py imports them at the top
        pytest.importorskip(module, reason=f"phantom_eval/utils.py imports {module}")
    root = Path(next(iter(spec.submodule_search_locations)))
    saved = {name: mod for name, mod in sys.modules.items()
             if name == "phantom_eval" or name.startswith("phantom_eval.")}
    stub = types.ModuleType("phantom_eval")
    stub.__path__ = [str(root)]
    sys.modules["phantom_eval"] = stub
    cwd = Path.cwd()
    scratch = tmp_path_factory.mktemp("phantom_eval")  # utils.py makes a joblib cache folder in the working directory
    try:
        os.chdir(scratch)
        for name in ("constants", "utils", "score"):
            module_spec = importlib.util.spec_from_file_location(f"phantom_eval.{name}", root / f"{name}.py")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
            setattr(stub, name, module)
        yield stub.score, stub.constants.answer_sep
    finally:
        os.chdir(cwd)
        for name in [n for n in sys.modules if n == "phantom_eval" or n.startswith("phantom_eval.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def random_answer_list(rng: random.Random, pool: list[str]) -> list[str]:
    words = rng.sample(pool, rng.randint(0, 4))
    return [rng.choice([w, w.upper(), f"  {w} ", w.title()]) for w in words]


def test_answer_list_scores_equal_phantom_evals_own_on_random_pairs(phantom_eval_score):
    score, sep = phantom_eval_score
    rng = random.Random(0)
    pool = ["Aida Wang", "Dino Beltran", "0295-05-30", "personal assistant", "2", "0", "meditation", ""]
    for _ in range(3000):
        gold = random_answer_list(rng, pool) or [rng.choice(pool)]
        predicted = random_answer_list(rng, pool)
        if rng.random() < 0.3:
            predicted = gold[:]  # equal lists, in another order and case
            rng.shuffle(predicted)
        prediction = rng.choice([sep, ", ", " ,", ",,"]).join(predicted)
        truth = sep.join(gold)  # phantom_eval joins the gold list with answer_sep before scoring
        ours = answer_list_scores(prediction, gold)
        assert ours["em"] == float(score.exact_match(prediction, truth, sep)), (prediction, gold)
        assert ours["precision"] == pytest.approx(score.precision(prediction, truth, sep))
        assert ours["recall"] == pytest.approx(score.recall(prediction, truth, sep))
        assert ours["f1"] == pytest.approx(score.f1(prediction, truth, sep))
    assert answer_list_scores("", [""]) == {"em": 1.0, "precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert float(score.f1("", "")) == 1.0  # empty vs empty, as the package scores it


def test_answer_list_rewards_score_boxed_lists_for_any_task():
    em, f1 = get_reward("answer_list_em"), get_reward("answer_list_f1")
    response = r"<search> x</search> <result>Page 1: …</result> <answer>\boxed{ bob, Alice }</answer>"
    assert em(response, ["Alice", "Bob"]) == 1.0 and f1(response, ["Alice", "Bob"]) == 1.0
    assert em(response, ["Alice", "Bob", "Carol"]) == 0.0
    assert f1(response, ["Alice", "Bob", "Carol"]) == pytest.approx(0.8)
    assert f1("no final answer", ["Alice"]) == 0.0
    # rows of the file task: a list answer column scores as a set
    scores = reward_function("answer_list_f1")(prompts=["q", "q"], completions=[r"\boxed{Alice}", r"\boxed{Carol}"],
                                               answer=[["Alice", "Bob"], ["Alice"]])
    assert scores == [pytest.approx(2 / 3), 0.0]


# ---------------------------------------------------------------- chains of the generator's queries

def test_parse_chain_follows_the_generators_query_shapes():
    chain = parse_chain(["parent(Y_4, Y_2)", "friend(Y_6, Y_4)", "friend(Y_8, Y_6)", 'job(Y_8, "paediatric nurse")'])
    assert (chain.root_name, chain.root_attribute, chain.hops, chain.last, chain.count) == \
        (None, ("job", "paediatric nurse"), ["friend", "friend"], "parent", False)
    chain = parse_chain(["dob(Y_3, Y_2)", "friend(Y_5, Y_3)", 'brother("Hayden Mcnew", Y_5)'])
    assert (chain.root_name, chain.hops, chain.last) == ("Hayden Mcnew", ["brother", "friend"], "dob")
    chain = parse_chain(['aggregate_all(count, distinct(brother("Hayden Mcnew", Y_1)), Count_1)'])
    assert (chain.root_name, chain.hops, chain.last, chain.count) == ("Hayden Mcnew", [], "brother", True)
    chain = parse_chain(['job(Y_2, "paediatric nurse")'])
    assert (chain.root_attribute, chain.hops, chain.last) == (("job", "paediatric nurse"), [], "")
    assert parse_chain(["weird goal"]) is None


# ---------------------------------------------------------------- a user's folder, bad input

def write_universe(folder: Path, questions: list[dict] | None = None) -> Path:
    """A two-person universe in the generator's file format."""
    folder.mkdir(parents=True, exist_ok=True)
    articles = [{"title": "Ann Lee", "article": "# Ann Lee",
                 "facts": ['son("Ann Lee", "Bo Lee")', 'job("Ann Lee", "poet")']},
                {"title": "Bo Lee", "article": "# Bo Lee",
                 "facts": ['mother("Bo Lee", "Ann Lee")', 'job("Bo Lee", "chemist")']}]
    for article in articles:
        article["facts"] = [f"{fact}." for fact in article["facts"]]
    questions = questions if questions is not None else [
        {"question": "Who is the son of Ann Lee?", "answer": ["Bo Lee"], "difficulty": 1, "type": 1,
         "template": ["Who is", "the", "<relation>_3", "of", "<name>_4", "?"], "is_aggregation_question": False,
         "prolog": {"query": ['son("Ann Lee", Y_2)'], "answer": "Y_2"}},
        {"question": "What is the occupation of the mother of Bo Lee?", "answer": ["poet"], "difficulty": 2, "type": 2,
         "template": [], "is_aggregation_question": False,
         "prolog": {"query": ["job(Y_3, Y_2)", 'mother("Bo Lee", Y_3)'], "answer": "Y_2"}}]
    (folder / "articles.json").write_text(json.dumps(articles))
    (folder / "questions.json").write_text(json.dumps(questions))
    return folder


def folder_config(tmp_path, **extra):
    return load_config("aepo", overrides={"task.name": "phantomwiki", "task.phantomwiki_dir": str(tmp_path / "pw"),
                                          "model.cache_dir": str(tmp_path / "cache"), **extra})


def test_a_folder_of_universes_gives_splits_corpora_and_phantomwikis_scores(tmp_path):
    write_universe(tmp_path / "pw" / "train")
    write_universe(tmp_path / "pw" / "test")
    task = get_task(folder_config(tmp_path))
    assert [len(task.examples(s)) for s in ("train", "dev", "test")] == [2, 2, 2]  # dev falls back to test
    example = task.examples("test")[1]
    assert example.answers == ["poet"] and example.extra_info["difficulty"] == 2
    assert example.extra_info["is_aggregation"] is False and example.extra_info["type"] == 2
    assert task.corpus("test")[0] == {"id": "test-0", "title": "Ann Lee",
                                      "text": "Ann Lee. son: Bo Lee. occupation: poet."}
    assert task.correct(example, r"<answer>\boxed{ Poet}</answer>")
    assert task.answer_scores(example, r"\boxed{poet, chemist}") == {"em": 0.0, "f1": pytest.approx(2 / 3)}
    assert task.reward_name == "answer_list_f1"
    # the teacher follows each question's chain through the split's own search tool
    for ex in task.examples("test"):
        solution = task.teacher_solution(ex, "test")
        assert answer_list_scores(solution.answer, ex.answers)["em"] == 1.0
    assert task.teacher_solution(example, "test").queries == ["Bo Lee", "Ann Lee"]


@pytest.mark.parametrize("case", ["no_folder", "no_test", "no_questions", "empty_answer"])
def test_bad_universe_folders_stop_before_any_model_naming_file_and_fix(tmp_path, case):
    if case != "no_folder":
        write_universe(tmp_path / "pw" / "train")
    if case == "no_questions":
        write_universe(tmp_path / "pw" / "test")
        (tmp_path / "pw" / "test" / "questions.json").unlink()
    if case == "empty_answer":
        write_universe(tmp_path / "pw" / "test", [{"question": "Who?", "answer": [], "difficulty": 1}])
    expected = {"no_folder": "no such folder", "no_test": "no test/ subfolder",
                "no_questions": r"test/questions.json does not exist",
                "empty_answer": r"questions.json item 1: key 'answer'"}
    with pytest.raises(PhantomWikiError, match=expected[case]):
        get_task(folder_config(tmp_path))
    assert issubclass(PhantomWikiError, UserError)


def test_renaming_draws_names_like_the_universes_own_and_keeps_gender(tmp_path, monkeypatch):
    import aepo_rl.tasks.phantomwiki as pw

    universe = read_universe(write_universe(tmp_path / "u"))
    universe.facts["Ann Lee"]["gender"], universe.facts["Bo Lee"]["gender"] = ["female"], ["male"]
    monkeypatch.setattr(pw.importlib.util, "find_spec", lambda name: None)  # a folder of universes, no generator
    parts = name_parts(universe)
    assert (parts.female, parts.male, parts.last) == (("Ann",), ("Bo",), ("Lee",))
    rng = random.Random(0)
    assert {parts.draw(rng, "female") for _ in range(5)} == {"Ann Lee"}
    assert {parts.draw(rng) for _ in range(50)} == {"Ann Lee", "Bo Lee"}
    monkeypatch.undo()
    if importlib.util.find_spec("phantom_wiki") is not None:  # the generator's own lists
        parts = name_parts(universe)
        assert len(parts.female) > 100 and len(parts.last) > 1000 and "Ann" not in parts.male


def test_read_universe_names_a_malformed_fact(tmp_path):
    folder = write_universe(tmp_path / "u")
    articles = json.loads((folder / "articles.json").read_text())
    articles[1]["facts"].append("not a fact")
    (folder / "articles.json").write_text(json.dumps(articles))
    with pytest.raises(PhantomWikiError, match=r"articles.json item 2: fact 'not a fact'"):
        read_universe(folder)


def test_a_missing_generator_is_a_user_error_with_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(PhantomWikiError, match="swi-prolog-nox") as err:
        get_task(load_config("aepo", overrides={**TINY_UNIVERSES, "model.cache_dir": str(tmp_path / "cache")}))
    assert "--ignore-requires-python" in str(err.value)
    assert not any((tmp_path / "cache").rglob("questions.json"))


# ---------------------------------------------------------------- generated universes

@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    if not HAVE_GENERATOR:
        pytest.skip("needs SWI-Prolog and phantom-wiki: " + INSTALL)
    cache = tmp_path_factory.mktemp("pwcache")
    cfg = load_config("aepo", overrides={**TINY_UNIVERSES, "model.cache_dir": str(cache),
                                         "task.teacher_error_rate": 0.25})
    return cfg, get_task(cfg), cache


@needs_generator
def test_generated_universes_are_cached_per_split_and_settings(generated):
    cfg, task, cache = generated
    folders = sorted(p.name for p in (cache / "phantomwiki").iterdir())
    assert [f.split("-")[0] for f in folders] == ["dev", "test", "train"]  # no staging folder left
    assert len(task.examples("train")) > len(task.examples("test")) > 0
    names = {split: set(task.universes[split].facts) for split in ("train", "dev", "test")}
    assert len(names["train"] & names["test"]) <= 2  # different universes (a rare name may recur)
    again = get_task(cfg)  # from the cache: the same questions
    assert [e.question for e in again.examples("test")] == [e.question for e in task.examples("test")]
    assert {e.extra_info["difficulty"] for e in task.examples("train")} <= {1, 2, 3, 4}  # easy mode, depth 10


@needs_generator
def test_the_teacher_answers_held_out_questions_and_demonstrations_hide_real_names(generated):
    cfg, task, _ = generated
    test = task.examples("test")
    solved = [task.teacher_solution(e, "test") for e in test]
    em = [answer_list_scores(s.answer, e.answers)["em"] if s else 0.0 for s, e in zip(solved, test)]
    assert sum(em) / len(em) >= 0.8  # measured 0.975 on a 250-person universe (docs/tasks-and-rewards.md)
    demos = task.demonstrations()
    assert demos and 0 < sum(d.has_error for d in demos) < len(demos)
    people = {name for universe in task.universes.values() for name in universe.facts}
    parts = name_parts(task.universes["train"])
    for demo in demos:
        text = demo.example.question + "".join(piece for piece, _ in demo.pieces)
        assert not any(name in text for name in people)
        answer = next(piece for piece, trained in reversed(demo.pieces) if trained)
        searched = re.findall(r"<search> (.*?)</search>", text)
        assert searched  # no mistake skips the searches (the cheapest behaviour to imitate)
        if not demo.has_error:
            assert task.correct(demo.example, answer)
        for name in (q for q in searched if re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", q)):  # renamed like the generator
            first, last = name.split(" ")
            assert first in parts.female + parts.male and last in parts.last
    detours = [d for d in demos if d.has_error and task.correct(d.example, d.pieces[-1][0])]
    assert detours and all(sum(tr and "<search>" in p for p, tr in d.pieces) >= 2 for d in detours)
    texts = "\n".join(task.texts())
    assert not any(name in texts for name in people)


@needs_generator
def test_a_failing_generator_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    import aepo_rl.tasks.phantomwiki as pw

    monkeypatch.setattr(pw, "generator_args", lambda cfg, split: ["--num-family-trees", "0", "--seed", "1"])
    cfg = load_config("aepo", overrides={**TINY_UNIVERSES, "model.cache_dir": str(tmp_path / "cache")})
    with pytest.raises(PhantomWikiError, match="generator failed for the train universe"):
        get_task(cfg)
    assert list((tmp_path / "cache" / "phantomwiki").iterdir()) == []
    monkeypatch.undo()
    no_questions = load_config("aepo", overrides={**TINY_UNIVERSES, "task.phantomwiki_question_depth": 2,
                                                  "model.cache_dir": str(tmp_path / "cache")})
    with pytest.raises(PhantomWikiError, match="unusable.*non-empty JSON list"):
        get_task(no_questions)
    assert list((tmp_path / "cache" / "phantomwiki").iterdir()) == []


@needs_generator
def test_verl_data_writes_parquet_and_each_splits_corpus(generated, tmp_path):
    import pyarrow.parquet as pq

    from aepo_rl.integrations.verl.data import write_verl_data

    cfg, task, _ = generated
    paths, _ = write_verl_data(cfg, tmp_path / "verl")
    assert sorted(p.name for p in paths.values()) == ["corpus_train.jsonl", "corpus_val.jsonl", "train.parquet",
                                                      "val.parquet"]
    rows = pq.read_table(paths["val"]).to_pylist()
    assert rows[0]["extra_info"]["reward"] == "answer_list_f1"
    assert rows[0]["reward_model"]["ground_truth"] == task.examples("dev")[0].answers
    corpus = [json.loads(line) for line in paths["corpus_val"].read_text().splitlines()]
    assert corpus == task.corpus("dev")


TINY_RUN = {"model.tiny_init": "random", "model.tiny_hidden_size": 32, "model.tiny_num_layers": 1,
            "model.tiny_intermediate_size": 64, "model.tiny_vocab_size": 400, "model.tiny_num_heads": 2,
            "model.tiny_num_kv_heads": 1, "model.tiny_head_dim": 16, "model.tiny_copy_steps": 2, "sft.epochs": 1,
            "sft.batch_size": 8, "rollout.n": 2, "rollout.max_response_length": 32, "rollout.max_tokens_per_round": 12,
            "rollout.premonitor_probe_tokens": 4, "trainer.batch_size": 2, "trainer.mini_batch_size": 1,
            "trainer.micro_batch_size": 2, "trainer.steps": 1, "eval.samples": 2, "eval.num_questions": 4,
            "trainer.run_name": "tiny"}


@pytest.mark.slow
@needs_generator
def test_aepo_train_and_eval_run_end_to_end_on_phantomwiki(tmp_path):
    from aepo_rl.cli import main

    knobs = {**TINY_UNIVERSES, **TINY_RUN, "model.cache_dir": str(tmp_path / "cache"),
             "trainer.run_dir": str(tmp_path / "runs")}
    assert main(["train", *(f"{k}={v}" for k, v in knobs.items())]) == 0
    run = tmp_path / "runs" / "tiny"
    result = json.loads((run / "eval.json").read_text())["rl"]["phantomwiki/test"]
    assert result["num_questions"] == 4 and 0.0 <= result["answer/f1/mean"] <= 1.0
    assert sum(level["num_questions"] for level in result["by_difficulty"].values()) == 4
    assert (run / "plots" / "pass_at_1_by_level.png").is_file()
    eval_knobs = {k: v for k, v in knobs.items() if k.startswith(("task.", "model.cache_dir", "eval.", "rollout."))}
    out = tmp_path / "eval.json"
    assert main(["eval", "--model", str(run / "checkpoints" / "sft"), "--out", str(out),
                 *(f"{k}={v}" for k, v in eval_knobs.items())]) == 0
    assert json.loads(out.read_text())["phantomwiki/test"]["by_difficulty"]


def test_evaluation_searches_the_split_universe_and_reports_em_f1_by_difficulty(tmp_path):
    from aepo_rl.evaluate import score_groups
    from aepo_rl.rollout.trajectory import Trajectory
    from aepo_rl.tasks.base import split_tools

    write_universe(tmp_path / "pw" / "train")
    write_universe(tmp_path / "pw" / "test")
    task = get_task(folder_config(tmp_path))
    assert split_tools(task, "test")["search"].index.docs[0]["id"] == "test-0"
    assert task.tools()["search"].index.docs[0]["id"] == "train-0"
    examples = task.examples("test")
    answers = [[r"\boxed{Bo Lee}", r"\boxed{Ann Lee}"], [r"\boxed{poet, chemist}", r"\boxed{poet}"]]
    groups = [[Trajectory(prompt_id=e.id, traj_id=i, parent_id=None, fork_token_index=None, prompt_token_ids=[1],
                          response_text=text) for i, text in enumerate(texts)] for e, texts in zip(examples, answers)]
    metrics, records = score_groups(task, examples, groups, 2)
    assert metrics["pass@1"] == 0.5 and metrics["answer/em/mean"] == 0.5
    assert metrics["answer/f1/mean"] == pytest.approx((1 + 0 + 2 / 3 + 1) / 4)
    assert metrics["by_difficulty"]["2"] == {"num_questions": 1, "pass@1": 0.5, "pass@k": 1.0, "tool_calls/mean": 0.0,
                                             "answer/em/mean": 0.5, "answer/f1/mean": pytest.approx(5 / 6)}
    assert [r["difficulty"] for r in records] == [1, 2] and records[1]["samples"][0]["scores"]["em"] == 0.0


def test_held_out_demonstrations_follow_the_split_universe(tmp_path):
    write_universe(tmp_path / "pw" / "train")
    write_universe(tmp_path / "pw" / "test")
    task = get_task(folder_config(tmp_path))
    demos = task.demonstrations_for("dev")
    assert [d.example.id for d in demos] == [e.id for e in task.examples("dev")] and not any(d.has_error for d in demos)
    text = "".join(piece for piece, _ in demos[1].pieces)
    assert "<search> Bo Lee</search>" in text and "Page 1: Ann Lee — Ann Lee. son: Bo Lee. occupation: poet." in text
    assert text.endswith(r"<answer>\boxed{ poet}</answer>")
