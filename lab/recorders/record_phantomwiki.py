"""The PhantomWiki recipe's seed record: `aepo train task.name=phantomwiki` from an empty cache per seed, then the
RL model on its training universe's questions; a table against the task's targets, with F1 by difficulty.

    python lab/recorders/record_phantomwiki.py --out DIR [--seeds 0,1,2,3,4] [KEY=VALUE ...]

Per seed s (seed s generates its own universes: training 3s+1, dev 3s+2, held-out test 3s+3):

    aepo train task.name=phantomwiki task.seed=s trainer.seed=s rollout.seed=s model.cache_dir=DIR/cache-s
               trainer.run_dir=DIR trainer.run_name=seed<s> KEY=VALUE ...
    aepo eval --model DIR/seed<s>/checkpoints/step_<last>/model --out DIR/seed<s>/train-universe.json
              task.name=phantomwiki task.seed=s eval.split=train eval.samples=1 KEY=VALUE ...

Each seed's result goes to ``DIR/seed<s>.json`` (wall and CPU seconds of the train command, its stage times, peak
RSS, SFT and RL EM = pass@1, F1 and F1 by difficulty on the held-out universe, the RL model's EM and F1 on the
training universe); a recorded seed is skipped, so two processes may record different seeds into one DIR, and
``--table-only`` rebuilds ``DIR/record.md`` from the seeds recorded so far. Targets: SFT EM ≥ 0.3, RL − SFT ≥ +0.10
EM, held-out EM ≥ 0.8 × the training universe's, the train command ≤ 600 s on a quiet 2-core machine (a loaded
machine's wall is no record: the table gives CPU seconds too).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from record_main_job import commit, last_model, machine, run_child, stage_seconds

from aepo_rl.compare import mean_ci95, split_entry

TARGETS = {"sft_min": 0.3, "gain_min": 0.10, "held_out_ratio_min": 0.8, "wall_max_s": 600}


def scores(entry: dict) -> dict:
    """EM (pass@1), pass@k, F1, tool calls and F1/EM per difficulty of one evaluated split."""
    return {"em": entry["pass@1"], "pass@k": entry["pass@k"], "f1": entry["answer/f1/mean"],
            "tool_calls": entry["tool_calls/mean"],
            "by_difficulty": {level: {"n": row["num_questions"], "em": row["pass@1"], "f1": row["answer/f1/mean"]}
                              for level, row in entry.get("by_difficulty", {}).items()}}


def record_seed(seed: int, out: Path, overrides: list[str]) -> dict:
    logs, run_dir = out / "logs", out / f"seed{seed}"
    logs.mkdir(parents=True, exist_ok=True)
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists without a record: remove it and {out / f'cache-{seed}'}, then rerun")
    task = ["task.name=phantomwiki", f"task.seed={seed}"]
    train = ["train", *task, f"trainer.seed={seed}", f"rollout.seed={seed}", f"model.cache_dir={out / f'cache-{seed}'}",
             f"trainer.run_dir={out}", f"trainer.run_name=seed{seed}", *overrides]
    wall, rss, code, cpu = run_child(train, dict(os.environ), logs / f"train-seed{seed}.log")
    if code:
        raise SystemExit(f"seed {seed}: aepo train exited {code}; see {logs / f'train-seed{seed}.log'}")
    results = json.loads((run_dir / "eval.json").read_text())
    sft, rl = (split_entry(results[stage], "test", run_dir / "eval.json") for stage in ("sft", "rl"))
    train_file = run_dir / "train-universe.json"
    *_, code, _ = run_child(["eval", "--model", str(last_model(run_dir)), "--out", str(train_file), *task,
                             f"model.cache_dir={out / f'cache-{seed}'}", "eval.split=train", "eval.samples=1",
                             *overrides], dict(os.environ), logs / f"train-universe-seed{seed}.log")
    if code:
        raise SystemExit(f"seed {seed}: aepo eval exited {code}; see {logs / f'train-universe-seed{seed}.log'}")
    on_train = split_entry(json.loads(train_file.read_text()), "train", train_file)
    return {"seed": seed, "commit": commit(), "wall_s": wall, "cpu_s": cpu, "peak_rss_gb": rss,
            "stages_s": stage_seconds((logs / f"train-seed{seed}.log").read_text()),
            "sft": scores(sft), "rl": scores(rl), "rl_train_universe": scores(on_train)}


def checks(entry: dict) -> dict[str, bool]:
    sft, rl, train = entry["sft"]["em"], entry["rl"]["em"], entry["rl_train_universe"]["em"]
    return {"sft": sft >= TARGETS["sft_min"], "gain": rl - sft >= TARGETS["gain_min"],
            "held_out": rl >= TARGETS["held_out_ratio_min"] * train}


def mean_interval(values: list[float]) -> str:
    """Mean ± the 95% t-interval's half-width over seeds (the mean alone for one seed)."""
    stat = mean_ci95(values)
    return f"{stat['mean']:.3f}" + (f" ± {stat['ci95']:.3f}" if stat["ci95"] is not None else "")


def table(entries: list[dict], overrides: list[str]) -> str:
    def mark(ok):
        return "" if ok else " ✗"

    lines = [f"Machine: {machine()}; commit {', '.join(sorted({e['commit'] for e in entries}))}; "
             f"overrides: {' '.join(overrides) or 'none'}", "",
             "| seed | wall | CPU | task+model+SFT | SFT eval | RL+eval | SFT EM (F1) | RL EM (F1) | Δ EM "
             "| training universe EM (held-out ×) | peak RSS |", "|" + "---|" * 11]
    for e in entries:
        ok, st, sft, rl, tr = checks(e), e["stages_s"], e["sft"], e["rl"], e["rl_train_universe"]
        lines.append(
            f"| {e['seed']} | {e['wall_s']:.0f} s | {e['cpu_s']:.0f} s | "
            + " | ".join(f"{st[s]:.0f} s" if s in st else "–" for s in ("task+model+SFT", "SFT eval", "RL+eval"))
            + f" | {sft['em']:.3f}{mark(ok['sft'])} ({sft['f1']:.3f}) | {rl['em']:.3f} ({rl['f1']:.3f}) | "
            f"{rl['em'] - sft['em']:+.3f}{mark(ok['gain'])} | {tr['em']:.3f} "
            f"({rl['em'] / tr['em'] if tr['em'] else float('nan'):.2f}×){mark(ok['held_out'])} | "
            f"{e['peak_rss_gb']:.2f} GB |")
    levels = sorted({level for e in entries for stage in ("sft", "rl") for level in e[stage]["by_difficulty"]}, key=int)
    lines += ["", "Held-out universes, by difficulty: mean over seeds ± 95% t-interval "
              "(questions per seed in brackets)", "",
              "| difficulty | SFT EM | SFT F1 | RL EM | RL F1 |", "|---|---|---|---|---|"]
    for level in levels:
        cells = [mean_interval([e[stage]["by_difficulty"][level][metric] for e in entries])
                 for stage in ("sft", "rl") for metric in ("em", "f1")]
        n = sorted({e["rl"]["by_difficulty"][level]["n"] for e in entries})
        lines.append(f"| {level} ({'/'.join(map(str, n))}) | " + " | ".join(cells) + " |")
    lines.append("| all | " + " | ".join(mean_interval([e[stage][metric] for e in entries])
                                          for stage in ("sft", "rl") for metric in ("em", "f1")) + " |")
    met = {name: all(checks(e)[name] for e in entries) for name in ("sft", "gain", "held_out")}
    lines += ["", f"Targets on every seed (✗ marks a miss): SFT EM ≥ {TARGETS['sft_min']} "
              f"{'met' if met['sft'] else 'NOT met'}; RL − SFT ≥ +{TARGETS['gain_min']:.2f} "
              f"{'met' if met['gain'] else 'NOT met'}; "
              f"held-out ≥ {TARGETS['held_out_ratio_min']}× the training universe "
              f"{'met' if met['held_out'] else 'NOT met'}; "
              f"≤ {TARGETS['wall_max_s']} s on a quiet 2-core machine: compare the CPU column "
              "(the wall of a shared machine is "
              "no record)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="the record's folder (runs, caches, logs, seed<s>.json)")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: rebuild record.md from the seeds recorded")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every seed's train and eval (none: the recipe)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in ([] if args.table_only else [int(s) for s in args.seeds.split(",") if s.strip()]):
        path = args.out / f"seed{seed}.json"
        if path.exists():
            print(f"seed {seed}: recorded")
            continue
        print(f"seed {seed}: running", flush=True)
        entry = {**record_seed(seed, args.out, args.overrides), "overrides": args.overrides}
        path.write_text(json.dumps(entry, indent=2) + "\n")
    entries = sorted((json.loads(p.read_text()) for p in args.out.glob("seed*.json")), key=lambda e: e["seed"])
    if not entries:
        print("no seed recorded yet")
        return 0
    if any(e["overrides"] != entries[0]["overrides"] for e in entries):
        raise SystemExit(f"{args.out}: the seeds were recorded with different overrides; use one folder per recipe")
    (args.out / "record.md").write_text(text := table(entries, entries[0]["overrides"]))
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
