"""The study's figures from an `aepo compare` folder (lab/notebook.md, "the multi-hop study"):

    python lab/study/figures.py COMPARE_DIR OUT_DIR [--prefix study]

- ``<prefix>_curves.png``: per arm, the mean over its seeds of each step's policy entropy, clip fraction on
  high-entropy tokens, branches per prompt and score (a trailing mean of 10 steps over the faint per-step mean);
- ``<prefix>_branches.png``: the consecutive-branch histogram (share of branch events at l = 0, 1, 2, ≥ 3) of
  each tree arm, mean over its seeds with each seed's value as a dot;
- ``<prefix>_hops.png``: pass@1 per hop level of every arm after RL (mean over seeds, 95% Student-t interval,
  each seed a dot), the SFT model's per-hop pass@1 as a dashed line.

Every run of compare.json's ``runs`` is drawn (none selected); the values are the final checkpoint's (eval.json)
and the logged steps (metrics.jsonl) that `aepo compare` tabulates.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from aepo_rl.compare import mean_ci95
from aepo_rl.report import mean_records, read_metrics, series, trailing_mean

CURVES = (("actor/entropy", "policy entropy (actor/entropy, nats)"),
          ("actor/pg_clipfrac_high_entropy", "clip fraction, high-entropy tokens"),
          ("rollout/branches_per_prompt", "branches per prompt"),
          ("critic/score/mean", "score (critic/score/mean)"))
LEVELS = ("l0", "l1", "l2", "l3plus")
SMOOTH = 10


def read_compare(compare_dir: Path) -> tuple[dict[str, list[dict]], dict | None]:
    """compare.json's per-run rows by arm (in its arm order) and the SFT model's test evaluation, if any."""
    data = json.loads((compare_dir / "compare.json").read_text())
    runs = {arm: data["runs"][arm] for arm in data["arms"] if data["runs"].get(arm)}
    sft_path = compare_dir / "sft" / "eval.json"
    sft = None
    if sft_path.is_file():  # aepo compare writes {"sft": {"<task>/test": …}}; aepo eval --out the inner mapping
        result = json.loads(sft_path.read_text())
        tests = [m for name, m in result.get("sft", result).items() if name.endswith("/test")]
        sft = tests[0] if tests else None
    return runs, sft


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _colors(arms: list[str]) -> dict[str, tuple]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {arm: cmap(i % 10) for i, arm in enumerate(arms)}


def _bar_with_seeds(ax, x: float, width: float, values: list[float], color, label: str | None,
                    interval: bool = False) -> None:
    """One bar at the mean of ``values`` (with its 95% Student-t interval if asked), each value a dot on it."""
    stat = mean_ci95(values)
    ax.bar(x, stat["mean"], width, color=color, label=label, yerr=stat["ci95"] if interval else None, capsize=2)
    ax.scatter([x] * len(values), values, color="black", s=6, zorder=3)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_curves(runs: dict[str, list[dict]], path: Path) -> Path:
    import matplotlib.pyplot as plt

    colors = _colors(list(runs))
    means = {arm: mean_records([read_metrics(row["run_dir"]) for row in rows]) for arm, rows in runs.items()}
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    for ax, (metric, title) in zip(axes.flat, CURVES):
        for arm, records in means.items():
            found = series(records, metric).get(metric)
            if not found:
                continue
            steps, values = found
            ax.plot(steps, values, color=colors[arm], alpha=0.2, linewidth=0.8)
            ax.plot(steps, trailing_mean(values, SMOOTH), color=colors[arm], label=f"{arm} (n={len(runs[arm])})")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"Mean over seeds per arm (faint: per step; solid: trailing mean of {SMOOTH} steps)")
    return _save(fig, path)


def plot_branches(runs: dict[str, list[dict]], path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    keys = [f"rollout/consecutive_branch_share/{level}" for level in LEVELS]
    trees = {arm: rows for arm, rows in runs.items()  # chain arms log zero shares: no branch ever
             if any(_finite(row.get("branches")) and row["branches"] > 0 for row in rows)}
    if not trees:
        return None
    colors = _colors(list(runs))
    width = 0.8 / len(trees)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for i, (arm, rows) in enumerate(trees.items()):
        for j, key in enumerate(keys):
            values = [row[key] for row in rows if _finite(row.get(key))]
            _bar_with_seeds(ax, j - 0.4 + width * (i + 0.5), width, values, colors[arm], arm if j == 0 else None)
    ax.set_xticks(range(len(LEVELS)), ["l = 0", "l = 1", "l = 2", "l ≥ 3"])
    ax.set_ylabel("share of branch events")
    ax.set_title("Consecutive branching (§1.4): l of P_t at each decision that branched (mean over steps; dots: seeds)",
                 fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_hops(runs: dict[str, list[dict]], sft: dict | None, path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    hops = sorted({int(key[3:].split(":")[0]) for rows in runs.values() for row in rows for key in row
                   if key.startswith("hop") and key.endswith(":pass@1")})
    if not hops:
        return None
    colors = _colors(list(runs))
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, (arm, rows) in enumerate(runs.items()):
        for j, hop in enumerate(hops):
            values = [row[f"hop{hop}:pass@1"] for row in rows if _finite(row.get(f"hop{hop}:pass@1"))]
            if not values:
                continue
            _bar_with_seeds(ax, j - 0.4 + width * (i + 0.5), width, values, colors[arm],
                            f"{arm} (n={len(values)})" if j == 0 else None, interval=True)
    by_hops = (sft or {}).get("by_hops") or {}
    for j, hop in enumerate(hops):
        if str(hop) in by_hops:
            ax.hlines(by_hops[str(hop)]["pass@1"], j - 0.45, j + 0.45, colors="black", linestyles="dashed",
                      label="SFT model" if j == 0 else None)
    ax.set_xticks(range(len(hops)), [f"{hop}-hop" for hop in hops])
    ax.set_ylabel("test pass@1 after RL")
    ax.set_title("pass@1 per hop level (bars: mean over seeds, 95% t interval; dots: seeds)", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    return _save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compare_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--prefix", default="study", help="file names <prefix>_curves.png, … (default: study)")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    runs, sft = read_compare(args.compare_dir)
    if not runs:
        parser.error(f"{args.compare_dir / 'compare.json'} has no finished runs")
    args.out_dir.mkdir(parents=True, exist_ok=True)

    def name(what):
        return args.out_dir / f"{args.prefix}_{what}.png"

    for path in (plot_curves(runs, name("curves")), plot_branches(runs, name("branches")),
                 plot_hops(runs, sft, name("hops"))):
        if path is not None:
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
