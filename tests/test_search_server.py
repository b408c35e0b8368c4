"""The search tool's HTTP side: `aepo serve-search` (the [server] extra: FastAPI and uvicorn) against the in-process
index, and the client's retries against a server that fails."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi", reason="the search server is the [server] extra: pip install -e '.[server]'")
import uvicorn  # noqa: E402  (after the skip: both come with the [server] extra)
from fastapi import FastAPI, HTTPException  # noqa: E402
from helpers import HAND_CORPUS, HAND_QUERIES, free_port  # noqa: E402

from aepo_rl.tools import SearchIndex, get_tool  # noqa: E402
from aepo_rl.tools.server import create_app, serve_main  # noqa: E402


@contextlib.contextmanager
def serving(app: FastAPI):
    """Run ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_http_server_and_in_process_index_rank_alike(tmp_path):
    index = SearchIndex(HAND_CORPUS, cache_dir=tmp_path)
    local = get_tool("search", corpus=HAND_CORPUS, cache_dir=tmp_path, topk=3)
    queries = [*HAND_QUERIES, "the", "Apollo Pompeii glacier", "zzzz"]
    with serving(create_app(index, topk=3)) as url:
        assert httpx.get(f"{url}/health").json() == {"status": "ok", "documents": 8, "corpus_sha256": index.sha256}
        body = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": 5, "return_scores": True}).json()
        expected = index.search(queries, 5)
        assert ([[item["document"]["id"] for item in row] for row in body["result"]]
                == [[h.id for h in row] for row in expected])
        assert ([[item["score"] for item in row] for row in body["result"]]
                == [[h.score for h in row] for row in expected])
        assert body["result"][0][0]["document"]["contents"] == "Mount Vesuvius\n" + HAND_CORPUS[0]["text"]
        bare = httpx.post(f"{url}/retrieve", json={"queries": queries[:1]}).json()["result"]
        assert bare[0][0] == {"id": "volcano", "contents": "Mount Vesuvius\n" + HAND_CORPUS[0]["text"]}
        assert httpx.post(f"{url}/retrieve", json={"queries": "not a list"}).status_code == 422
        huge = httpx.post(f"{url}/retrieve", json={"queries": ["volcano " * 200_000], "topk": 1}, timeout=30)
        assert huge.status_code == 200 and huge.json()["result"][0][0]["id"] == "volcano"
        remote = get_tool("search", url=url, topk=3)
        assert remote.search_batch(queries) == [local.run(q) for q in queries]
        assert remote.run(queries[0]) == local.run(queries[0])
        assert remote.stats == {"calls": len(queries) + 1, "errors": 0, "cache_hits": 1}


def test_client_retries_server_errors_then_succeeds():
    app, answers = FastAPI(), iter([503, 502])

    @app.post("/retrieve")
    def flaky(request: dict):
        status = next(answers, 200)
        if status != 200:
            raise_status(status)
        return {"result": [[{"document": {"id": "7", "contents": '"Quoted Title"\nbody text'}, "score": 2.5}]]}

    with serving(app) as url:
        tool = get_tool("search", url=url + "/retrieve", retries=3, backoff=0.01)
        assert tool.run("anything") == "Page 1: Quoted Title — body text"
    assert tool.stats["errors"] == 0


def test_invalid_server_answer_is_an_error_text():
    app = FastAPI()

    @app.post("/retrieve")
    def wrong_shape(request: dict):
        return {"result": []}

    with serving(app) as url:
        tool = get_tool("search", url=url, retries=0)
        assert tool.run("q") == f"Error: search failed: {url}/retrieve answered 0 result lists for 1 queries"
    assert tool.stats == {"calls": 1, "errors": 1, "cache_hits": 0}


def raise_status(status: int):
    raise HTTPException(status_code=status)


def test_serve_main_reports_a_bad_corpus(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text("not json\n")
    assert serve_main(str(path), port=free_port(), cache_dir=str(tmp_path)) == 2
    assert "bad.jsonl:1: malformed JSON" in capsys.readouterr().err
