"""Runs one round's tool calls concurrently, with per-call timeouts and a per-rollout cache (§1.1)."""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor, wait

from aepo_rl.protocol import ToolCallRequest
from aepo_rl.tools.base import Tool, ToolError


class ToolRunner:
    """Thread pool of ``workers`` threads; identical calls (same tool, same argument) run once.

    Timeouts: a round's calls are submitted together and get ``timeout`` seconds of worker
    time each, i.e. the round waits at most ``timeout × ceil(unique calls / workers)``; a
    call still running then is answered with an error text (its thread is abandoned and the
    pool replaced, so later rounds get fresh workers). A tool that raises is answered with
    an error text too. A call is an error (``is_error``) when it timed out, raised, returned a
    :class:`ToolError`, or could not be run at all (``ToolCallRequest.error``: an unknown tool,
    unusable Hermes JSON); the text is passed on unchanged either way. Only successful results
    are cached.
    """

    def __init__(self, tools: dict[str, Tool], workers: int, timeout: float):
        self.tools, self.workers, self.timeout = tools, workers, timeout
        self.cache: dict[tuple[str, str], str] = {}
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="aepo-tool")

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
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="aepo-tool")
        out = []
        for req in requests:
            if req.error is not None:
                out.append((req.error, True))
            else:
                key = (req.key, req.arg)
                out.append(fresh[key] if key in fresh else (self.cache[key], False))
        return out

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
