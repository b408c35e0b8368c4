"""Cost of one python-tool call in each isolation mode that works here, side by side in one run.

Every mode runs the same small program (``import math`` and a final expression, what a model's
calculation looks like), one call per mode per round, modes in turn so that machine load hits
them alike; a mode that cannot run here is named and left out. Prints each mode's median ms per
call and, last, ``ratio <mode>/none: <median ratio>`` for each mode: its cost over a bare
``python -I`` start (isolation ``none``), the ratio of the two calls of one round, median of the
rounds. The modes with a private root (docs/tools.md) pay for their namespaces and mounts there.

    python benchmarks/bench_sandbox.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

from aepo_rl.tools.python import ISOLATION_MODES, PythonSandbox

CODE = "import math\nmath.factorial(20) % 997"
EXPECTED = str(2432902008176640000 % 997)


def call_ms(tool: PythonSandbox) -> float:
    start = time.perf_counter()
    text = tool.run(CODE)
    elapsed = (time.perf_counter() - start) * 1000
    if text != EXPECTED:
        raise RuntimeError(f"isolation {tool.isolation!r} answered {text!r} instead of {EXPECTED!r}")
    return elapsed


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
        call_ms(tool)
    times = {mode: [] for mode in tools}
    for _ in range(args.rounds):
        for mode, tool in tools.items():
            times[mode].append(call_ms(tool))
    for mode, values in times.items():
        print(f"{mode}: {statistics.median(values):.1f} ms per call (median of {args.rounds})")
    for mode, values in times.items():
        if mode != "none":
            ratio = statistics.median(a / b for a, b in zip(values, times["none"]))
            print(f"ratio {mode}/none: {ratio:.2f}")


if __name__ == "__main__":
    main()
