"""Console output and progress of long phases (model build, copy warm-up, SFT, RL, evaluation, compare).

On a terminal a phase shows a rich progress bar with elapsed time and ETA. When the output is a
file or a pipe (a job scheduler's log, ``| tee``) it prints a plain line at the start, then every
``PLAIN_EVERY_S`` seconds or each ``PLAIN_EVERY_FRACTION`` of the work, and at the end; lines are
never wrapped (rich would wrap at 80 columns and split step lines and config keys mid-word).
This module imports only rich, so ``aepo config show`` stays fast.
"""

from __future__ import annotations

import time

import rich
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

PIPED_WIDTH = 1000
"""Console width in characters when the output is not a terminal: wide enough that no table or log line wraps."""

PLAIN_EVERY_S = 30.0
PLAIN_EVERY_FRACTION = 0.1
"""Without a terminal, a phase prints a progress line at least every 30 seconds of work and at each
tenth of it."""


def get_console() -> Console:
    """rich's process-wide console, set so that nothing wraps when the output is not a terminal.

    One console for every module: rich nests the progress bar of an evaluation inside the RL
    bar only when both draw on the same console."""
    console = rich.get_console()
    if not console.is_terminal:
        console.soft_wrap = True
        console.width = PIPED_WIDTH
    return console


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class PhaseProgress:
    """Progress of one phase of ``total`` units (steps, questions, runs); use as a context manager
    and call :meth:`advance` after each piece of work.

    ``completed`` units are already done (a resumed run). A phase that ends early (the copy
    warm-up stops at its target) says where it stopped.
    """

    def __init__(self, label: str, total: int, *, unit: str = "steps", completed: int = 0,
                 console: Console | None = None):
        self.label, self.total, self.unit, self.done, self._initial = label, total, unit, completed, completed
        self.console = console or get_console()
        self._bar: Progress | None = None
        self._task = None
        self._start = self._last_line = 0.0
        self._last_fraction = 0

    def __enter__(self) -> PhaseProgress:
        self._start = self._last_line = time.perf_counter()
        if self.console.is_terminal:
            self._bar = Progress(TextColumn(f"[bold]{escape(self.label)}[/]"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[info]}"), console=self.console)
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.done, info="")
            self._bar.start()
        else:
            self._print(f"{self.label}: {self.done}/{self.total} {self.unit}")
        self._last_fraction = self._tenths()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.done < self.total and exc[0] is None:
            self._print(f"{self.label}: stopped at {self.done}/{self.total} {self.unit} after "
                        f"{_duration(time.perf_counter() - self._start)}")

    def advance(self, amount: int = 1, info: str = "") -> None:
        """``amount`` more units done; ``info`` (e.g. "loss 0.41") is shown beside the count."""
        self.done += amount
        if self._bar is not None:
            self._bar.update(self._task, advance=amount, info=info)
            return
        now = time.perf_counter()
        tenths = self._tenths()
        if now - self._last_line >= PLAIN_EVERY_S or tenths > self._last_fraction or self.done >= self.total:
            self._last_line, self._last_fraction = now, tenths
            elapsed = now - self._start
            line = f"{self.label}: {self.done}/{self.total} {self.unit}, {_duration(elapsed)} elapsed"
            if self._initial < self.done < self.total:
                line += f", ETA {_duration(elapsed / (self.done - self._initial) * (self.total - self.done))}"
            self._print(line + (f", {info}" if info else ""))

    def _tenths(self) -> int:
        return int(self.done / self.total / PLAIN_EVERY_FRACTION) if self.total else 0

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
