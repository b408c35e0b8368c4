"""Cost of one python-tool call in each isolation mode that works here, side by side in one run.

Every mode runs the same small program (``import math`` and a final expression, what a model's
calculation looks like), one call per mode per round, modes in turn so that machine load hits
them alike; a mode that cannot run here is named and left out. Per call it takes the wall time
and the CPU time (user + system) of the processes the call started and waited for, which a busy
machine disturbs much less. Prints each mode's medians and, last,
``ratio <mode>/bare wall: <x>, cpu: <y>`` for each mode: the ratio of its call to the bare call
of the same round (``bare``: the sandbox's code runner alone in one interpreter, as your user,
with no isolation at all; what isolation ``none`` was before its supervisor), median of the
rounds. The interpreter's own start-up can differ between users (``.pth`` files in site-packages
that do more for one user, a Python install that ``nobody`` cannot read, as ``nobody`` then
finds another one): read the ratios of the modes that run the code as ``nobody`` with that in mind.
``bwrap`` exits without waiting for the processes of its namespace, so bubblewrap's CPU figure is
bwrap's own only.

    python benchmarks/bench_sandbox.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from aepo_rl.tools.python import ISOLATION_MODES, RUNNER, PythonSandbox, SandboxUnavailable

CODE = "import math\nmath.factorial(20) % 997"
EXPECTED = str(2432902008176640000 % 997)


class Bare:
    """The code runner alone: one interpreter with the sandbox's limits, nothing around it."""

    isolation = "bare"

    def run(self, code: str) -> str:
        limits = [str(8), str(512 << 20), str(16 << 20), str(resource.getrlimit(resource.RLIMIT_NPROC)[1]), "1"]
        command = [os.path.realpath(sys.executable), "-I", "-u", "-c", RUNNER, *limits]
        return subprocess.run(command, input=code.encode(), capture_output=True, check=True).stdout.decode().strip()


def call(tool) -> tuple[float, float]:
    """Wall and CPU ms of one call (CPU: the children it waited for, their own children included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    text = tool.run(CODE)
    wall = (time.perf_counter() - start) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if text != EXPECTED:
        raise RuntimeError(f"isolation {tool.isolation!r} answered {text!r} instead of {EXPECTED!r}")
    return wall, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    tools = {"bare": Bare()}
    for mode in ISOLATION_MODES:
        try:
            tools[mode] = PythonSandbox(isolation=mode)
        except SandboxUnavailable as err:
            print(f"{mode}: does not work on this machine, left out ({err})")
    for tool in tools.values():  # warm-up: page cache, first imports
        call(tool)
    times = {mode: [] for mode in tools}
    for _ in range(args.rounds):
        for mode, tool in tools.items():
            times[mode].append(call(tool))
    for mode, values in times.items():
        wall, cpu = (statistics.median(v) for v in zip(*values))
        print(f"{mode}: {wall:.1f} ms wall, {cpu:.1f} ms cpu per call (medians of {args.rounds})")
    for mode, values in times.items():
        if mode != "bare":
            wall, cpu = (statistics.median(a[i] / max(b[i], 1e-3) for a, b in zip(values, times["bare"]))
                         for i in (0, 1))
            print(f"ratio {mode}/bare wall: {wall:.2f}, cpu: {cpu:.2f}")


if __name__ == "__main__":
    main()
