"""Cost of one python-tool call in each isolation mode that works here, side by side in one run.

Every mode runs the same small program (``import math`` and a final expression, what a model's
calculation looks like), one call per mode per round, modes in turn so that machine load hits
them alike; a mode that cannot run here is named and left out. Per call it takes the wall time
and the CPU time (user + system) of the processes the call started and waited for, which a busy
machine disturbs much less. Prints each mode's medians and, last,
``ratio <mode>/none wall: <x>, cpu: <y>`` for each other mode: the ratio of its call to the bare
call (isolation ``none``: the interpreter alone, as your user) of the same round, median of the
rounds. The interpreter's own start-up can differ between users (``.pth`` files in site-packages
that do more for one user, a Python install that ``nobody`` cannot read, as ``nobody`` then
finds another one): read the ratios of the modes that run the code as ``nobody`` with that in mind.
``bwrap`` exits without waiting for the processes of its namespace, so bubblewrap's CPU figure is
bwrap's own only.

    python benchmarks/bench_sandbox.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from aepo_rl.tools.python import ISOLATION_MODES, PythonSandbox

CODE = "import math\nmath.factorial(20) % 997"
EXPECTED = str(2432902008176640000 % 997)


def call(tool: PythonSandbox) -> tuple[float, float]:
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
    tools = {}
    for mode in ISOLATION_MODES:
        tool = PythonSandbox(isolation=mode)
        if tool.run("6 * 7") == "42":
            tools[mode] = tool
        else:
            print(f"{mode}: does not work on this machine, left out")
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
        if mode != "none":
            wall, cpu = (statistics.median(a[i] / max(b[i], 1e-3) for a, b in zip(values, times["none"])) for i in (0, 1))
            print(f"ratio {mode}/none wall: {wall:.2f}, cpu: {cpu:.2f}")


if __name__ == "__main__":
    main()
