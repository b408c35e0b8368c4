"""Failed tool calls are marked as errors in the trajectory, counted in the rollout metrics and
the evaluation results, and warned about once when they exceed rollout.tool_error_warn_share."""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fakes import EchoSearch, FakeEngine
from helpers import build_tiny_model

from aepo_rl.config import RolloutConfig, load_config
from aepo_rl.evaluate import eval_main, evaluate
from aepo_rl.rollout.tree import run_rollout
from aepo_rl.tasks.base import Example
from aepo_rl.tools import PythonSandbox, SearchTool, ToolError

WARNING = "of the tool calls failed"


def searches_then_answer(calls: int):
    """Rounds 0..calls-1 search q0, q1, … (distinct, so nothing is cached), then answer."""
    return lambda seq: (f"<search>q{seq.rounds}</search>" if seq.rounds < calls else "<answer>\\boxed{x}</answer>", 1.0)


def rollout(tokenizer, tools, script, num_prompts=1, **cfg):
    config = RolloutConfig(**{"mode": "independent", "n": 2, "max_response_length": 512, "call_limit": 10, **cfg})
    prompts = [(f"p{i}", tokenizer.encode(f"question {i}", add_special_tokens=False)) for i in range(num_prompts)]
    return run_rollout(FakeEngine(tokenizer, script), prompts, tools, config)


def calls_of(result):
    return [call for group in result.groups for traj in group for call in traj.tool_calls]


def dead_url() -> str:
    """A URL on 127.0.0.1 at a port nobody listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def http_server():
    """start(status) → the URL of a local retrieval server answering every POST with ``status``
    (200: one valid page per query); shut down after the test."""
    servers = []

    def start(status: int) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                queries = json.loads(self.rfile.read(int(self.headers["content-length"])))["queries"]
                hit = {"document": {"id": "d1", "contents": "Title\nbody"}, "score": 1.0}
                body = json.dumps({"result": [[hit] for _ in queries]} if status == 200
                                  else {"detail": "boom"}).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_dead_server_rollout_counts_its_tool_errors(tiny_tokenizer):
    search = SearchTool(url=dead_url(), retries=1, backoff=0.01, timeout=2.0)
    result = rollout(tiny_tokenizer, {"search": search}, searches_then_answer(3), num_prompts=2)
    calls = calls_of(result)
    assert len(calls) == 12  # 2 prompts × 2 samples × 3 searches
    assert all(call.error for call in calls)
    assert all(call.result.startswith("Error: search failed:") and "unreachable after 2 attempts" in call.result
               for call in calls)
    assert result.metrics["rollout/tool_errors"] == result.metrics["rollout/tool_calls"] == 12
    assert search.stats["errors"] == search.stats["calls"] > 0
    record = result.groups[0][0].to_json()["rounds"][0]["tool_call"]
    assert record["error"] is True and record["result"].startswith("Error: search failed:")


@pytest.mark.parametrize("status, failed", [(500, True), (404, True), (200, False)])
def test_an_http_error_is_a_tool_error(tiny_tokenizer, http_server, status, failed):
    search = SearchTool(url=http_server(status), retries=1, backoff=0.01, timeout=5.0)
    result = rollout(tiny_tokenizer, {"search": search}, searches_then_answer(2))
    calls = calls_of(result)
    assert len(calls) == 4 and [call.error for call in calls] == [failed] * 4
    assert result.metrics["rollout/tool_errors"] == (4 if failed else 0)
    assert result.metrics["rollout/tool_calls"] == 4
    if failed:
        assert all(call.result.startswith("Error: search failed:") for call in calls)
        assert ("HTTP 500" if status == 500 else "404") in calls[0].result
    else:
        assert calls[0].result == "Page 1: Title — body"


def test_a_sandbox_timeout_is_an_error_and_an_exception_of_the_models_code_is_not(tiny_tokenizer):
    sandbox = PythonSandbox(timeout=1.0, pool_size=2)
    code = ["while True:\n    pass", "x = 1\n1 / 0", "6 * 7"]

    def script(seq):
        return (f"<python>{code[seq.rounds]}</python>" if seq.rounds < 3 else "<answer>42</answer>", 1.0)

    result = rollout(tiny_tokenizer, {"python": sandbox}, script, n=1)
    stopped, raised, fine = result.groups[0][0].tool_calls
    assert stopped.error and stopped.result.startswith("Error:")
    assert "CPU time limit of 1 s exceeded" in stopped.result or "timed out after 1 s" in stopped.result
    assert not raised.error and raised.result.startswith("Traceback")
    assert raised.result.endswith("ZeroDivisionError: division by zero")
    assert not fine.error and fine.result == "42"
    assert result.metrics["rollout/tool_errors"] == 1 and result.metrics["rollout/tool_calls"] == 3
    assert sandbox.stats["errors"] == 1 and sandbox.stats["calls"] == 3


def test_a_sandbox_that_cannot_start_is_an_error():
    sandbox = PythonSandbox(timeout=1.0, isolation="none")
    sandbox.python = "/nonexistent/python"
    text = sandbox.run("6 * 7")
    assert isinstance(text, ToolError) and text.startswith("Error: the sandbox failed: FileNotFoundError")


def test_an_unknown_hermes_tool_is_an_error(tiny_tokenizer):
    search = EchoSearch()
    calls = ['<tool_call>{"name": "browse", "arguments": {"url": "x"}}</tool_call>',
             '<tool_call>{"name": "search", "arguments": {"query": "b"}}</tool_call>']

    def script(seq):
        return (calls[seq.rounds] if seq.rounds < 2 else "<answer>y</answer>", 1.0)

    result = rollout(tiny_tokenizer, {"search": search}, script, n=1, tool_format="hermes")
    unknown, known = result.groups[0][0].tool_calls
    assert unknown.error and unknown.result.startswith("Error: unknown tool 'browse'")
    assert not known.error and known.result == "found b" and search.calls == ["b"]
    assert result.metrics["rollout/tool_errors"] == 1


def test_a_user_tool_reports_failure_with_tool_error_and_plain_text_stays_a_result(tiny_tokenizer):
    class Flaky(EchoSearch):
        def run(self, arg):
            super().run(arg)
            return ToolError("Error: backend down") if arg == "q0" else "Error: is just a word here"

    flaky = Flaky()
    result = rollout(tiny_tokenizer, {"search": flaky}, searches_then_answer(2), n=1)
    first, second = result.groups[0][0].tool_calls
    assert (first.error, first.result, type(first.result)) == (True, "Error: backend down", str)
    assert (second.error, second.result) == (False, "Error: is just a word here")


# ----------------------------------------------------------------------------------------------
# Evaluation results and the one loud warning


class DeadSearchTask:
    """Two questions whose only tool is a search server that refuses connections."""

    name = "fake"

    def __init__(self, url: str):
        self.url = url
        self._examples = [Example(id=f"q{i}", question=f"question {i}", answers=["x"], data_source="fake",
                                  messages=[{"role": "user", "content": f"question {i}"}]) for i in range(2)]

    def examples(self, split):
        return self._examples

    def tools(self):
        return {"search": SearchTool(url=self.url, retries=0, timeout=2.0)}

    def correct(self, example, response_text):
        return "\\boxed{x}" in response_text

    def reward(self, example, response_text):
        return float(self.correct(example, response_text))

    def demonstrations(self):
        return []

    def texts(self):
        return []


def test_evaluation_results_report_tool_errors(tiny_tokenizer):
    task = DeadSearchTask(dead_url())
    cfg = load_config(overrides=["eval.samples=2"])
    engine = FakeEngine(tiny_tokenizer, searches_then_answer(2))
    m = evaluate(engine, task, task.examples("test"), cfg, "test", with_records=True)["fake/test"]
    assert m["tool_calls/mean"] == 2 and m["tool_errors/mean"] == 2
    assert [s["tool_errors"] for r in m["records"] for s in r["samples"]] == [2, 2, 2, 2]
    assert m["pass@1"] == 1.0  # the answers are still scored


@pytest.mark.parametrize("share, warnings", [("0.5", 1), ("1", 0)])
def test_aepo_eval_warns_once_when_tool_errors_pass_the_threshold(monkeypatch, tiny_tokenizer, caplog, share, warnings):
    import aepo_rl.evaluate

    monkeypatch.setattr(aepo_rl.evaluate, "get_task", lambda cfg: DeadSearchTask(dead_url()))
    monkeypatch.setattr(aepo_rl.evaluate, "load_policy", lambda cfg, task: ("model", tiny_tokenizer))
    monkeypatch.setattr(aepo_rl.evaluate, "build_engine",
                        lambda cfg, model, tok: FakeEngine(tok, searches_then_answer(2)))
    cfg = load_config(overrides=["eval.samples=2", "eval.batch_size=1", f"rollout.tool_error_warn_share={share}"])
    with caplog.at_level(logging.WARNING):
        assert eval_main(cfg) == 0
    loud = [r for r in caplog.records if WARNING in r.getMessage()]
    assert len(loud) == warnings
    if warnings:
        assert "100% of the tool calls failed in the evaluation of fake/test (8 of 8" in loud[0].getMessage()


def test_an_rl_run_warns_once_when_tool_errors_pass_the_threshold(monkeypatch, tiny_tokenizer, caplog):
    from aepo_rl.engines.hf import HFEngine
    from aepo_rl.train import rl

    task = DeadSearchTask(dead_url())
    fake = FakeEngine(tiny_tokenizer, searches_then_answer(1))
    monkeypatch.setattr(rl, "run_rollout", lambda engine, *args, **kwargs: run_rollout(fake, *args, **kwargs))
    cfg = load_config(overrides={"rollout.n": 2, "trainer.batch_size": 2, "trainer.mini_batch_size": 1,
                                 "trainer.micro_batch_size": 1, "rollout.max_response_length": 64,
                                 "rollout.premonitor": False, "rollout.global_samples": 2})
    model = build_tiny_model(tiny_tokenizer, seed=1)
    trainer = rl.RLTrainer(cfg, model, tiny_tokenizer, task, HFEngine(model, tiny_tokenizer, seed=0))
    with caplog.at_level(logging.WARNING):
        steps = [trainer.step() for _ in range(2)]
    assert all(m["rollout/tool_errors"] == m["rollout/tool_calls"] == 4 for m in steps)
    loud = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(loud) == 1 and "in RL step 1 (4 of 4;" in loud[0] and "rollout.tool_error_warn_share=0.5" in loud[0]
