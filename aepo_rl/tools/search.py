"""The ``search`` tool: BM25 over a corpus in-process, or a Search-R1 ``/retrieve`` client.

The index (``bm25s`` with the PyStemmer English stemmer and English stop words) is built once
and cached under ``<cache_dir>/search/<corpus-sha256>/``. Results are formatted as the
release does (docs/algorithm.md §1.1): one ``Page i: title — text`` line per hit, each text
capped to ``max_chars`` characters. Any Search-R1 compatible server works (ours from
``aepo serve-search``, Search-R1's, verl's): ``POST /retrieve {"queries", "topk",
"return_scores"}`` → ``{"result": [[{"document": {"id", "contents": "Title\\ntext"}, "score"}]]}``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

from aepo_rl.tools.base import ToolError, argument_error, register_tool
from aepo_rl.tools.corpus import corpus_sha256, load_corpus

log = logging.getLogger(__name__)

INDEX_SETTINGS = {"format": 1, "stemmer": "english", "stopwords": "english", "fields": "title+text"}
"""Everything besides the corpus that shapes the index; a cached index with other settings is rebuilt."""
SETTINGS_FILE = "aepo_index_settings.json"


@dataclass(frozen=True)
class Hit:
    id: str
    title: str
    text: str
    score: float


class SearchIndex:
    """A BM25 index over a corpus (thread-safe; queries take about a millisecond)."""

    def __init__(self, docs: list[dict], cache_dir: str | Path = "~/.cache/aepo_rl"):
        import bm25s
        import Stemmer

        self.docs = docs
        self.sha256 = corpus_sha256(docs)
        self.folder = Path(cache_dir).expanduser() / "search" / self.sha256
        self._stemmer = Stemmer.Stemmer(INDEX_SETTINGS["stemmer"])
        self._lock = threading.Lock()
        self.loaded_from_cache = False
        settings = self.folder / SETTINGS_FILE
        if settings.is_file() and json.loads(settings.read_text()) == INDEX_SETTINGS:
            try:
                self._retriever = bm25s.BM25.load(str(self.folder), show_progress=False)
                self.loaded_from_cache = True
            except (OSError, ValueError) as err:
                log.warning("search index cache %s is unreadable (%s); rebuilding it", self.folder, err)
        if not self.loaded_from_cache:
            self._retriever = bm25s.BM25()
            texts = [f"{d['title']}\n{d['text']}" for d in docs]
            self._retriever.index(self._tokenize(texts, ids=True), show_progress=False)
            self._save()

    @classmethod
    def from_corpus(cls, corpus: str | Path | list[dict], cache_dir: str | Path = "~/.cache/aepo_rl",
                    seed: int = 0) -> SearchIndex:
        """Load the corpus (``load_corpus``: path | "synthetic" | "wiki" | list) and index it."""
        return cls(load_corpus(corpus, seed=seed), cache_dir=cache_dir)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """The ``topk`` best documents per query, best first; documents sharing no term are left out."""
        k = min(topk, len(self.docs))
        with self._lock:  # the stemmer and the retriever are not safe to share across threads
            ids, scores = self._retriever.retrieve(self._tokenize(queries, ids=False), k=k, show_progress=False,
                                                   n_threads=1)
        return [
            [self._hit(int(i), float(s)) for i, s in zip(row_ids, row_scores) if s > 0]
            for row_ids, row_scores in zip(ids, scores)
        ]

    def _hit(self, row: int, score: float) -> Hit:
        doc = self.docs[row]
        return Hit(doc["id"], doc["title"], doc["text"], score)

    def _tokenize(self, texts: list[str], ids: bool):
        import bm25s

        return bm25s.tokenize(texts, stopwords=INDEX_SETTINGS["stopwords"], stemmer=self._stemmer,
                              return_ids=ids, show_progress=False)

    def _save(self) -> None:
        """Write the index to a temporary folder, then rename it into place (atomic; races are
        harmless). An unwritable cache only costs a rebuild next time."""
        try:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{self.sha256}.", dir=self.folder.parent))
            self._retriever.save(str(staging), show_progress=False)
            (staging / SETTINGS_FILE).write_text(json.dumps(INDEX_SETTINGS))
        except OSError as err:
            log.warning("cannot cache the search index under %s: %s", self.folder.parent, err)
            return
        shutil.rmtree(self.folder, ignore_errors=True)
        try:
            os.rename(staging, self.folder)
        except OSError:  # another process just wrote the same index
            shutil.rmtree(staging, ignore_errors=True)


def format_results(hits: list[Hit], max_chars: int) -> str:
    """The release's result text: ``Page i: title — text`` per hit, text capped to ``max_chars``."""
    if not hits:
        return "No results found."
    return "\n".join(f"Page {i}: {hit.title} — {_cap(hit.text, max_chars)}" for i, hit in enumerate(hits, start=1))


def _cap(text: str, max_chars: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"


class SearchUnavailable(RuntimeError):
    """The retrieval server did not answer after all retries."""


class RetrievalClient:
    """Client of a Search-R1 compatible ``/retrieve`` endpoint with timeouts and exponential back-off."""

    def __init__(self, url: str, timeout: float = 5.0, retries: int = 3, backoff: float = 0.2):
        self.url = url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self.retries = retries
        self.backoff = backoff
        self._http = httpx.Client(timeout=timeout)

    def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """One POST for all queries; retries connection errors, timeouts and 5xx answers
        ``retries`` times, sleeping ``backoff · 2^attempt`` seconds in between."""
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        for attempt in range(self.retries + 1):
            try:
                response = self._http.post(self.url, json=payload)
                if response.status_code < 500:
                    response.raise_for_status()
                    rows = response.json()["result"]
                    if len(rows) != len(queries):
                        raise SearchUnavailable(f"{self.url} answered {len(rows)} result "
                                                f"lists for {len(queries)} queries")
                    return [[_parse_hit(item) for item in row] for row in rows]
                problem = f"HTTP {response.status_code}"
            except (httpx.TransportError, httpx.TimeoutException) as err:
                problem = f"{type(err).__name__}: {err}"
            except (httpx.HTTPStatusError, ValueError, KeyError, TypeError) as err:
                raise SearchUnavailable(f"{self.url} gave an invalid answer: {err}") from None
            if attempt < self.retries:
                time.sleep(self.backoff * 2**attempt)
        raise SearchUnavailable(f"{self.url} unreachable after {self.retries + 1} attempts ({problem})")


def _parse_hit(item: dict) -> Hit:
    """A Search-R1 result item: ``{"document": {"id", "contents": "Title\\ntext"}, "score"}``
    (or the bare document when the server was asked for no scores)."""
    doc = item.get("document", item)
    if "contents" in doc:
        title, _, text = doc["contents"].partition("\n")
        title = title.strip().strip('"')
    else:
        title, text = doc.get("title", ""), doc.get("text", "")
    return Hit(str(doc.get("id", "")), title, text, float(item.get("score", 0.0)))


@register_tool("search")
class SearchTool:
    """``<search>query</search>`` → the top-k pages, from an in-process index or a server.

    ``run`` never raises: a bad query or a failed retrieval (server unreachable or timing out,
    an HTTP error, an invalid answer) comes back as ``Error: …`` text, a :class:`ToolError`, and
    is counted in ``stats`` (calls, errors, cache_hits); "No results found." is a result.
    Results are cached per (query, k). Thread-safe; ``search_batch`` sends many queries in one request.
    ``perturb(query, hits) -> hits``, when given, rewrites every query's hits before they are
    formatted (the synthetic task's search noise); it must be deterministic, as results are cached.
    """

    name = "search"
    tag = "search"
    argument = "query"
    usage = "searches"
    description = "Search the knowledge corpus; returns the top pages for a query."

    def __init__(self, corpus: str | Path | list[dict] | None = None, url: str | None = None, topk: int = 3,
                 timeout: float = 5.0, retries: int = 3, backoff: float = 0.2, max_chars: int = 300,
                 max_query_chars: int = 1000, cache_dir: str | Path = "~/.cache/aepo_rl", seed: int = 0,
                 cache_size: int = 4096, perturb: Callable[[str, list[Hit]], list[Hit]] | None = None):
        if corpus is None and url is None:
            raise ValueError("the search tool needs a corpus (path, 'synthetic', "
                             "'wiki' or a list of documents) or a url")
        self.topk, self.max_chars, self.max_query_chars, self.cache_size = topk, max_chars, max_query_chars, cache_size
        self.perturb = perturb
        self.client = RetrievalClient(url, timeout, retries, backoff) if url else None
        self.index = None if url else SearchIndex.from_corpus(corpus, cache_dir=cache_dir, seed=seed)
        self.stats = {"calls": 0, "errors": 0, "cache_hits": 0}
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def run(self, arg: str) -> str:
        return self.search_batch([arg])[0]

    def search_batch(self, queries: list[str]) -> list[str]:
        """Result texts for many queries at once (one retrieval for all uncached ones)."""
        results: list[str | None] = [None] * len(queries)
        pending: dict[str, list[int]] = {}
        with self._lock:
            self.stats["calls"] += len(queries)
            for i, query in enumerate(queries):
                problem = argument_error(query, self.max_query_chars) or (
                    None if query.strip() else ToolError("Error: empty search query."))
                if problem:
                    results[i] = problem
                    self.stats["errors"] += 1
                elif query.strip() in self._cache:
                    results[i] = self._cache[query.strip()]
                    self._cache.move_to_end(query.strip())
                    self.stats["cache_hits"] += 1
                else:
                    pending.setdefault(query.strip(), []).append(i)
        if pending:
            self._fill(results, pending)
        return results

    def _fill(self, results: list[str | None], pending: dict[str, list[int]]) -> None:
        try:
            if self.client is not None:
                hit_lists = self.client.retrieve(list(pending), self.topk)
            else:
                hit_lists = self.index.search(list(pending), self.topk)
        except Exception as err:  # never raise into the rollout: the agent sees the error text
            message = ToolError(f"Error: search failed: {err}")
            log.warning("search tool: %s (%d queries)", message, len(pending))
            with self._lock:
                self.stats["errors"] += sum(len(rows) for rows in pending.values())
            for rows in pending.values():
                for i in rows:
                    results[i] = message
            return
        with self._lock:
            for (query, rows), hits in zip(pending.items(), hit_lists):
                text = format_results(self.perturb(query, hits) if self.perturb else hits, self.max_chars)
                self._cache[query] = text
                for i in rows:
                    results[i] = text
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
