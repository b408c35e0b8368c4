"""``aepo serve-search``: the BM25 index over HTTP with Search-R1's retrieval API.

``POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}`` →
``{"result": [[{"document": {"id", "contents": "Title\\ntext"}, "score": s}, ...], ...]}``
(bare documents when ``return_scores`` is false), and ``GET /health``.
"""

from __future__ import annotations

import sys

from fastapi import FastAPI
from pydantic import BaseModel, Field

from aepo_rl.tools.corpus import CorpusError
from aepo_rl.tools.search import SearchIndex

MAX_QUERIES_PER_REQUEST = 4096
MAX_QUERY_CHARS = 4096


class RetrieveRequest(BaseModel):
    queries: list[str] = Field(max_length=MAX_QUERIES_PER_REQUEST)
    topk: int | None = Field(default=None, ge=1, le=1000)
    return_scores: bool = False


def create_app(index: SearchIndex, topk: int = 3) -> FastAPI:
    """A FastAPI app answering Search-R1 ``/retrieve`` requests from ``index``; ``topk`` is the
    default when a request gives none."""
    app = FastAPI(title="aepo-rl search", description="BM25 retrieval, Search-R1 API")

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "documents": len(index.docs), "corpus_sha256": index.sha256}

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> dict:
        queries = [query[:MAX_QUERY_CHARS] for query in request.queries]
        rows = index.search(queries, request.topk or topk)
        result = []
        for hits in rows:
            docs = [{"id": hit.id, "contents": f"{hit.title}\n{hit.text}"} for hit in hits]
            if request.return_scores:
                result.append([{"document": doc, "score": hit.score} for doc, hit in zip(docs, hits)])
            else:
                result.append(docs)
        return {"result": result}

    return app


def serve_main(corpus: str, host: str = "127.0.0.1", port: int = 8000, topk: int = 3, seed: int = 0,
               cache_dir: str = "~/.cache/aepo_rl") -> int:
    """Index ``corpus`` (JSONL path | "synthetic" | "wiki") and serve it until interrupted."""
    import uvicorn

    try:
        index = SearchIndex.from_corpus(corpus, cache_dir=cache_dir, seed=seed)
    except CorpusError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    source = "cache" if index.loaded_from_cache else "built"
    print(f"search index: {len(index.docs)} documents ({source}, {index.folder}); serving http://{host}:{port}/retrieve")
    uvicorn.run(create_app(index, topk=topk), host=host, port=port, log_level="warning")
    return 0
