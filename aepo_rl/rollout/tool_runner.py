"""Runs one round's tool calls concurrently, with per-call timeouts and a per-rollout cache (§1.1)."""

from __future__ import annotations

import math
import queue
import threading
from concurrent.futures import Future, wait

from aepo_rl.protocol import ToolCallRequest
from aepo_rl.tools.base import Tool, ToolError


class ToolRunner:
    """Thread pool of ``workers`` threads; identical calls (same tool, same argument) run once.

    Timeouts: a round's calls are submitted together and get ``timeout`` seconds of worker
    time each, i.e. the round waits at most ``timeout × ceil(unique calls / workers)``; a
    call still running then is answered with an error text (its thread is abandoned and the
    pool replaced, so later rounds get fresh workers). The workers are daemon threads
    (:class:`DaemonPool`): an abandoned call that never returns cannot keep the process alive at
    exit, and every idle worker ends when the pool is replaced or closed. A tool that raises is answered with
    an error text too. A call is an error (``is_error``) when it timed out, raised, returned a
    :class:`ToolError`, or could not be run at all (``ToolCallRequest.error``: an unknown tool,
    unusable Hermes JSON); the text is passed on unchanged either way. Only successful results
    are cached.
    """

    def __init__(self, tools: dict[str, Tool], workers: int, timeout: float):
        self.tools, self.workers, self.timeout = tools, workers, timeout
        self.cache: dict[tuple[str, str], str] = {}
        self.executor = DaemonPool(workers)

    def run(self, requests: list[ToolCallRequest]) -> list[tuple[str, bool]]:
        """(result text, is_error) for every request, in order."""
        pending: dict[tuple[str, str], Future] = {}
        for req in requests:
            key = (req.key, req.arg)
            if req.error is None and key not in self.cache and key not in pending:
                pending[key] = self.executor.submit(self.tools[req.key].run, req.arg)
        if pending:
            waves = math.ceil(len(pending) / self.workers)
            wait(list(pending.values()), timeout=self.timeout * waves)
        fresh: dict[tuple[str, str], tuple[str, bool]] = {}
        for (tag, arg), future in pending.items():
            name = self.tools[tag].name
            if not future.done():
                fresh[(tag, arg)] = (f"Error: tool '{name}' timed out after {self.timeout:g} s.", True)
            elif future.exception() is not None:
                err = future.exception()
                fresh[(tag, arg)] = (f"Error: tool '{name}' failed: {type(err).__name__}: {err}", True)
            elif isinstance(future.result(), ToolError):
                fresh[(tag, arg)] = (str(future.result()), True)
            else:
                self.cache[(tag, arg)] = str(future.result())
        if any(not f.done() for f in pending.values()):
            self.executor.shutdown()
            self.executor = DaemonPool(self.workers)
        out = []
        for req in requests:
            if req.error is not None:
                out.append((req.error, True))
            else:
                key = (req.key, req.arg)
                out.append(fresh[key] if key in fresh else (self.cache[key], False))
        return out

    def close(self) -> None:
        self.executor.shutdown()


class DaemonPool:
    """At most ``workers`` daemon threads running ``fn(arg)`` calls from a queue, each answered through a
    :class:`~concurrent.futures.Future`.

    ``concurrent.futures.ThreadPoolExecutor`` is not used: the interpreter joins its workers at exit, so
    one call stuck in a hung user tool kept the process alive after the script ended. Here a stuck
    worker dies with the process. ``shutdown`` cancels the calls not started and ends every idle worker
    at once; a worker busy in a call ends when that call returns.
    """

    def __init__(self, workers: int, name: str = "aepo-tool"):
        self.workers, self.name = workers, name
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.idle = 0
        self.lock = threading.Lock()

    def submit(self, fn, arg) -> Future:
        future: Future = Future()
        self.jobs.put((future, fn, arg))
        with self.lock:
            if self.idle > 0:
                self.idle -= 1  # an idle worker takes this call
            elif len(self.threads) < self.workers:
                thread = threading.Thread(target=self._work, name=f"{self.name}-{len(self.threads)}", daemon=True)
                self.threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            future, fn, arg = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(arg))
                except BaseException as err:  # noqa: BLE001 - the caller reads it from the future
                    future.set_exception(err)
            with self.lock:
                self.idle += 1

    def shutdown(self) -> None:
        """Cancel the calls not started; every worker ends once it is free (the idle ones now)."""
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in self.threads:
            self.jobs.put(None)
