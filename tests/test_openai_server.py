"""``aepo eval --endpoint`` against a real OpenAI-compatible server that is not vLLM: ``transformers serve`` over
the tiny model, offline on the CPU. That server refuses vLLM's request fields (HTTP 422), takes string prompts only
and returns no log-probs; the engine finds this out with its first request, sends every later one (concurrently)
as plain OpenAI text, and the evaluation reports the entropy as unavailable rather than NaN.

``transformers serve`` needs FastAPI, Uvicorn (aepo-rl's dependencies) and ``openai`` (``pip install "openai>=1.98"``,
part of ``transformers[serving]``); without them the test is skipped. The server takes about a minute to start
on a busy two-core machine, so the test is marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import httpx
import pytest
from helpers import build_tiny_model

from aepo_rl import cli

pytestmark = pytest.mark.slow


def _serving_missing() -> str | None:
    if shutil.which("transformers") is None:
        return "the transformers CLI is not on PATH"
    probe = "from transformers.utils.import_utils import is_serve_available as a; raise SystemExit(0 if a() else 1)"
    if subprocess.run([sys.executable, "-c", probe], env=os.environ).returncode:
        return 'transformers serve needs openai: pip install "openai>=1.98" (transformers[serving])'
    return None


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_tokenizer):
    """``transformers serve`` of the tiny model: (base URL, model folder)."""
    if reason := _serving_missing():
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("served") / "tiny"
    build_tiny_model(tiny_tokenizer).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(folder.parent / "serve.log", "w")
    server = subprocess.Popen(["transformers", "serve", str(folder), "--host", "127.0.0.1", "--port", str(port),
                               "--device", "cpu", "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"transformers serve exited with {server.returncode}: "
                            f"{(folder.parent / 'serve.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(1)
        else:
            pytest.fail("transformers serve did not answer /health within 300 s")
        yield f"{url}/v1", str(folder)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_the_server_is_strict_as_the_newcomer_met_it(served):
    url, folder = served
    answer = httpx.post(f"{url}/completions", json={"model": folder, "prompt": "Who", "max_tokens": 2,
                                                    "return_tokens_as_token_ids": True, "top_k": 5}, timeout=60)
    assert answer.status_code == 422 and "return_tokens_as_token_ids" in answer.text


def test_eval_on_transformers_serve(served, tmp_path, capsys, caplog):
    url, folder = served
    out = tmp_path / "eval.json"
    status = cli.main(["eval", "--endpoint", url, "--endpoint-model", folder, "--model", folder, "--samples", "2",
                       "--out", str(out), "eval.num_questions=4", "eval.batch_size=4",
                       "rollout.max_response_length=48", "rollout.max_tokens_per_round=16"])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    (result,) = json.loads(out.read_text()).values()
    assert result["num_questions"] == 4 and result["k"] == 2 and 0 <= result["pass@1"] <= 1
    assert result["entropy/token_mean"] is None  # the server returns no log-probs: unavailable, not NaN
    assert "entropy/token_mean unavailable" in printed.out
    assert "top_k=20 is not applied" in caplog.text  # evaluation's default top_k, which this server cannot take
    records = (tmp_path / "eval.records.jsonl").read_text().splitlines()
    assert len(records) == 4
