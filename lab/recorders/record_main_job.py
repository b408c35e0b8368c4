"""The main job's seed record: `aepo train` from an empty cache, one seed at a time, with AVX2 or the default
kernels, then each RL model on a world it never saw; a table against the main job's targets.

    python lab/recorders/record_main_job.py --out DIR [--seeds 0,1,2,3,4] [--kernels avx2|default]
                                         [--unseen-seed 7] [--against OTHER_DIR] [KEY=VALUE ...]

Per seed s, alone (run nothing else on the machine; the wall time is the record):

    aepo train task.seed=s trainer.seed=s rollout.seed=s model.cache_dir=DIR/cache-s trainer.run_dir=DIR
               trainer.run_name=seed<s> KEY=VALUE ...
    aepo eval --model DIR/seed<s>/checkpoints/step_<last>/model --out DIR/seed<s>/unseen.json
              task.seed=<unseen> KEY=VALUE ...

``--kernels avx2`` sets ``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2`` for both
(``bench_avx2.AVX2_ENV``: what a machine without AVX-512 runs). Each seed's wall time, the job's own stage
times (its last line), the child's peak RSS and the evaluations go to ``DIR/record.json``; a finished seed is
kept, so the same command continues an interrupted record. ``DIR/record.md`` is the table, with the targets:
SFT pass@1 ≥ 0.3, RL − SFT ≥ +0.10, unseen-world pass@1 ≥ 0.8 × the RL model's test pass@1, wall ≤ 600 s.
``--against OTHER_DIR`` (a record of the same job with the other kernels) adds ``ratio avx2/default`` of the
wall and of each stage, per seed both records hold and in all, to the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from aepo_rl.compare import split_entry

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # bench_avx2 stays with the benchmarks
from bench_avx2 import AVX2_ENV  # noqa: E402

TARGETS = {"sft_min": 0.3, "gain_min": 0.10, "unseen_ratio_min": 0.8, "wall_max_s": 600}
STAGE_NAMES = ("task+model+SFT", "SFT eval", "RL+eval")
STAGES = re.compile(r"done in (\d+) s \(([^)]*)\)")


def run_child(args: list[str], env: dict[str, str], log: Path) -> tuple[float, float, int, float]:
    """Run ``python -m aepo_rl ARGS`` with its output in ``log``: (wall seconds, peak RSS in GB, exit code, CPU
    seconds: user + system)."""
    with open(log, "w") as out:
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "aepo_rl", *args], env=env, stdout=out,
                                 stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
    return wall, usage.ru_maxrss / 1024 ** 2, os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime


def stage_seconds(log_text: str) -> dict[str, float]:
    """The job's own stage times from its last line, ``done in N s (task+model+SFT a s, SFT eval b s, …)``."""
    found = STAGES.findall(" ".join(log_text.split()))
    if not found:
        return {}
    return {name.strip(): float(value) for name, value in re.findall(r"([^,]+?) (\d+) s", found[-1][1])}


def last_model(run_dir: Path) -> Path:
    steps = sorted((run_dir / "checkpoints").glob("step_*"))
    if not steps:
        raise SystemExit(f"{run_dir}: no RL checkpoint (checkpoints/step_*); see {run_dir.parent / 'logs'}")
    return steps[-1] / "model"


def record_seed(seed: int, out: Path, env: dict[str, str], unseen_seed: int, overrides: list[str]) -> dict:
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    run_dir = out / f"seed{seed}"
    train = ["train", f"task.seed={seed}", f"trainer.seed={seed}", f"rollout.seed={seed}",
             f"model.cache_dir={out / f'cache-{seed}'}", f"trainer.run_dir={out}", f"trainer.run_name=seed{seed}",
             *overrides]
    if run_dir.exists():  # an interrupted earlier attempt: its time is not a record, start again from scratch
        raise SystemExit(f"{run_dir} exists without a record: remove it and {out / f'cache-{seed}'}, then rerun")
    wall, rss, code, _ = run_child(train, env, logs / f"train-seed{seed}.log")
    if code:
        raise SystemExit(f"seed {seed}: aepo train exited {code}; see {logs / f'train-seed{seed}.log'}")
    results = json.loads((run_dir / "eval.json").read_text())
    unseen_file = run_dir / "unseen.json"
    *_, code, _ = run_child(["eval", "--model", str(last_model(run_dir)), "--out", str(unseen_file),
                            f"task.seed={unseen_seed}", *overrides], env, logs / f"unseen-seed{seed}.log")
    if code:
        raise SystemExit(f"seed {seed}: aepo eval exited {code}; see {logs / f'unseen-seed{seed}.log'}")
    sft, rl = (split_entry(results[stage], "test", run_dir / "eval.json") for stage in ("sft", "rl"))
    unseen = split_entry(json.loads(unseen_file.read_text()), "test", unseen_file)
    return {"seed": seed, "commit": commit(), "wall_s": wall, "peak_rss_gb": rss,
            "stages_s": stage_seconds((logs / f"train-seed{seed}.log").read_text()),
            "sft": {k: sft[k] for k in ("pass@1", "pass@k", "tool_calls/mean")},
            "rl": {k: rl[k] for k in ("pass@1", "pass@k", "tool_calls/mean")},
            "unseen": {"task.seed": unseen_seed, "pass@1": unseen["pass@1"], "pass@k": unseen["pass@k"]}}


def checks(entry: dict) -> dict[str, bool]:
    sft, rl, unseen = entry["sft"]["pass@1"], entry["rl"]["pass@1"], entry["unseen"]["pass@1"]
    return {"sft": sft >= TARGETS["sft_min"], "gain": rl - sft >= TARGETS["gain_min"],
            "unseen": unseen >= TARGETS["unseen_ratio_min"] * rl, "wall": entry["wall_s"] <= TARGETS["wall_max_s"]}


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}×" if reference else "–"


def table(record: dict) -> str:
    def mark(ok):
        return "" if ok else " ✗"

    lines = [f"Kernels: {record['kernels']}; machine: {record['machine']}; "
             f"commit {', '.join(sorted({e['commit'] for e in record['seeds']}))}; "
             f"overrides: {' '.join(record['overrides']) or 'none'}", "",
             "| seed | wall | task+model+SFT | SFT eval | RL+eval | SFT pass@1 (pass@k) | RL pass@1 (pass@k) "
             "| Δ pass@1 "
             "| unseen world pass@1 (× test) | peak RSS |", "|" + "---|" * 10]
    oks = [checks(entry) for entry in record["seeds"]]
    for entry, ok in zip(record["seeds"], oks):
        stage = entry["stages_s"]
        sft, rl, unseen = entry["sft"], entry["rl"], entry["unseen"]
        lines.append(
            f"| {entry['seed']} | {entry['wall_s']:.0f} s{mark(ok['wall'])} | "
            + " | ".join(f"{stage[s]:.0f} s" if s in stage else "–" for s in STAGE_NAMES)
            + f" | {sft['pass@1']:.3f}{mark(ok['sft'])} ({sft['pass@k']:.3f}) | "
            f"{rl['pass@1']:.3f} ({rl['pass@k']:.3f}) | "
            f"{rl['pass@1'] - sft['pass@1']:+.3f}{mark(ok['gain'])} | {unseen['pass@1']:.3f} "
            f"({_ratio(unseen['pass@1'], rl['pass@1'])}){mark(ok['unseen'])} | {entry['peak_rss_gb']:.2f} GB |")
    met = {name: all(ok[name] for ok in oks) for name in ("wall", "sft", "gain", "unseen")}
    lines += ["", f"Targets on every seed (✗ marks a miss): wall ≤ {TARGETS['wall_max_s']} s "
              f"{'met' if met['wall'] else 'NOT met'}; "
              f"SFT pass@1 ≥ {TARGETS['sft_min']} {'met' if met['sft'] else 'NOT met'}; "
              f"RL − SFT ≥ +{TARGETS['gain_min']:.2f} "
              f"{'met' if met['gain'] else 'NOT met'}; unseen ≥ {TARGETS['unseen_ratio_min']}× test "
              f"{'met' if met['unseen'] else 'NOT met'}."]
    return "\n".join(lines) + "\n"


def ratio_table(record: dict, other: dict) -> str:
    """``ratio avx2/default`` of the wall and each stage, for the seeds both records hold (and their sums)."""
    avx2, default = (record, other) if record["kernels"] == "avx2" else (other, record)
    columns = ("wall", *STAGE_NAMES)

    def seconds(entry):
        return [entry["wall_s"], *(entry["stages_s"].get(name, 0.0) for name in STAGE_NAMES)]

    by_seed = {e["seed"]: seconds(e) for e in default["seeds"]}
    rows = [(str(e["seed"]), seconds(e), by_seed[e["seed"]]) for e in avx2["seeds"] if e["seed"] in by_seed]
    if not rows:
        return "ratio avx2/default: no seed in both records yet\n"
    rows.append(("all", [sum(col) for col in zip(*(r[1] for r in rows))],
                 [sum(col) for col in zip(*(r[2] for r in rows))]))
    lines = ["", "| seed | " + " | ".join(f"ratio avx2/default: {name}" for name in columns) + " |",
             "|" + "---|" * (len(columns) + 1)]
    for seed, a_row, d_row in rows:
        lines.append(f"| {seed} | " + " | ".join(f"{a / d:.2f} ({a:.0f} / {d:.0f} s)" if d else "–"
                                                 for a, d in zip(a_row, d_row)) + " |")
    return "\n".join(lines) + "\n"


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                          text=True).stdout.strip() or "unknown"


def machine() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.*)", flags)
    return (f"{model.group(1).strip() if model else platform.processor()}, {os.cpu_count()} CPUs, "
            f"{'AVX-512' if ' avx512f' in flags else 'no AVX-512'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="the record's folder (runs, caches, logs, record.json/.md)")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--kernels", choices=("avx2", "default"), default="avx2")
    parser.add_argument("--unseen-seed", type=int, default=7, help="task.seed of the world the RL models never saw")
    parser.add_argument("--against", type=Path, help="a record of the same job with the other kernels: adds "
                        "`ratio avx2/default` per stage")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every seed's train and eval (none: the main job)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.unseen_seed in seeds:
        parser.error(f"--unseen-seed {args.unseen_seed} is one of the seeds' own worlds: choose another")
    env = {k: v for k, v in os.environ.items() if k not in AVX2_ENV}
    if args.kernels == "avx2":
        env.update(AVX2_ENV)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "record.json"
    fresh = {"kernels": args.kernels, "overrides": args.overrides, "unseen_seed": args.unseen_seed}
    record = json.loads(path.read_text()) if path.exists() else {**fresh, "machine": machine(), "seeds": []}
    if any(record[key] != value for key, value in fresh.items()):
        parser.error(f"{path} was recorded with {({k: record[k] for k in fresh})}: use another --out")
    other = None
    if args.against:  # checked before any seed runs
        other_path = args.against / "record.json"
        if not other_path.is_file():
            parser.error(f"--against {args.against}: no record.json there (run this script with --out {args.against})")
        other = json.loads(other_path.read_text())
        if other["kernels"] == args.kernels or other["overrides"] != args.overrides:
            parser.error(f"--against {args.against}: recorded with {other['kernels']} kernels and overrides "
                         f"{other['overrides'] or 'none'}; it needs the same job with the other kernels")
    done = {entry["seed"] for entry in record["seeds"]}
    for seed in seeds:
        if seed in done:
            print(f"seed {seed}: recorded")
            continue
        print(f"seed {seed}: running ({args.kernels} kernels)", flush=True)
        record["seeds"].append(record_seed(seed, args.out, env, args.unseen_seed, args.overrides))
        record["seeds"].sort(key=lambda e: e["seed"])
        path.write_text(json.dumps(record, indent=2) + "\n")
        (args.out / "record.md").write_text(table(record))
    print(table(record) + (ratio_table(record, other) if other else ""), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
