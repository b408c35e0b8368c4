"""A hung tool never outlives its run: the tool runner's workers are daemon threads, so a call that
never returns cannot keep the process alive at exit, and no idle worker is left behind by a step."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from aepo_rl.protocol import ToolCallRequest
from aepo_rl.rollout.tool_runner import ToolRunner

ROOT = Path(__file__).resolve().parents[1]


class Blocking:
    """A tool whose calls wait on ``release`` (a hung tool until it is set)."""

    name = tag = "wait"
    description = "waits"

    def __init__(self):
        self.release = threading.Event()

    def run(self, arg: str) -> str:
        self.release.wait()
        return f"done {arg}"


def tool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aepo-tool")]


def test_a_script_whose_tool_hangs_exits_when_it_is_done():
    hang = 600  # seconds the tool would sleep; the process must end long before
    script = textwrap.dedent(f"""
        import time
        from aepo_rl.protocol import ToolCallRequest
        from aepo_rl.rollout.tool_runner import ToolRunner

        class Sleepy:
            name = tag = "sleepy"
            description = "sleeps"
            def run(self, arg):
                time.sleep({hang})
                return "never"

        runner = ToolRunner({{"sleepy": Sleepy()}}, workers=2, timeout=0.2)
        print(runner.run([ToolCallRequest("sleepy", "sleepy", "x")])[0][0], flush=True)
        runner.close()
        print("script done", flush=True)
    """)
    # Before the fix the interpreter joined the abandoned worker at exit: the process lived the whole hang.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=hang / 4,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["Error: tool 'sleepy' timed out after 0.2 s.", "script done"]


def test_a_timed_out_round_leaves_no_idle_worker_and_the_hung_one_ends_when_its_call_returns():
    tool = Blocking()
    runner = ToolRunner({"wait": tool}, workers=3, timeout=0.1)
    before = set(tool_threads())
    first = runner.run([ToolCallRequest("wait", "wait", "a")])
    assert first == [("Error: tool 'wait' timed out after 0.1 s.", True)]
    tool.release.set()  # later calls return at once
    for step in range(5):  # later rounds run on fresh workers
        assert runner.run([ToolCallRequest("wait", "wait", f"b{step}"), ToolCallRequest("wait", "wait", f"c{step}")]) \
            == [(f"done b{step}", False), (f"done c{step}", False)]
    runner.close()
    for thread in set(tool_threads()) - before:
        thread.join(timeout=30)
        assert not thread.is_alive(), f"{thread.name} outlived the runner"


def test_workers_are_daemon_threads_and_at_most_workers_run_at_once():
    tool = Blocking()
    runner = ToolRunner({"wait": tool}, workers=2, timeout=0.2)
    before = set(tool_threads())
    results = runner.run([ToolCallRequest("wait", "wait", str(i)) for i in range(5)])
    assert all(error for _, error in results)
    started = set(tool_threads()) - before
    assert len(started) == 2 and all(t.daemon for t in started)
    tool.release.set()
    runner.close()
