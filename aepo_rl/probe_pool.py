"""`aepo report PROBE.json ...`: the results of `aepo probe --out` on several checkpoints, one table per probe.

One probe on one checkpoint gives each metric's paired effect a − b over that checkpoint's units (prompts or
mini-batches) with its 95% interval (docs/mechanisms.md). Whether a mechanism does what the paper says *in
general* is a question about checkpoints: several training seeds, or several stages of one run. Here the unit
is the checkpoint: for each metric, every file's effect side by side, then the mean of the files' effects with
its 95% Student-t interval over the files (n = files) and how many files' own intervals lie above or below 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aepo_rl.compare.stats import mean_interval
from aepo_rl.errors import UserError


class ProbeFileError(UserError, ValueError):
    """A file is not the JSON of `aepo probe --out`; the message names it."""


def read_probe_file(path: str | Path) -> dict[str, Any]:
    """One `aepo probe --out` file, checked for the keys the pooled table reads."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProbeFileError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ProbeFileError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict) or not {"probe", "claim", "effects", "settings"} <= set(data):
        raise ProbeFileError(f"{path}: not the output of `aepo probe --out` (it needs the keys probe, claim, "
                             "settings and effects)")
    for effect in data["effects"]:
        if not isinstance(effect, dict) or "metric" not in effect or "mean" not in effect.get("diff", {}):
            raise ProbeFileError(f"{path}: an effect without metric or diff.mean: {str(effect)[:120]}")
    return data


def pool(files: list[str | Path]) -> dict[str, dict[str, Any]]:
    """``{probe: {"claim", "files", "metrics": [{metric, expected, per_file: [diff], pooled, above, below}]}}``:
    each file's paired effect, the mean over files with its 95% t-interval (``pooled``: mean, ci95, n, low,
    high), and the count of files whose own interval lies wholly above (``above``) or below (``below``) 0."""
    out: dict[str, dict[str, Any]] = {}
    for path in files:
        data = read_probe_file(path)
        entry = out.setdefault(data["probe"], {"claim": data["claim"], "files": [], "metrics": {}})
        column = len(entry["files"])
        entry["files"].append({"file": str(path), "model": data["settings"].get("model"),
                               "task": data["settings"].get("task")})
        for effect in data["effects"]:
            row = entry["metrics"].setdefault(effect["metric"], {"metric": effect["metric"],
                                                                "expected": effect.get("expected", ""),
                                                                "per_file": {}})
            row["per_file"][column] = effect["diff"]
    for entry in out.values():
        rows = []
        for row in entry["metrics"].values():
            diffs = [row["per_file"].get(i) for i in range(len(entry["files"]))]
            pooled = mean_interval([d["mean"] for d in diffs if d is not None and d["mean"] is not None])
            rows.append({"metric": row["metric"], "expected": row["expected"], "per_file": diffs, "pooled": pooled,
                         "above": sum(d is not None and d.get("low") is not None and d["low"] > 0 for d in diffs),
                         "below": sum(d is not None and d.get("high") is not None and d["high"] < 0 for d in diffs)})
        entry["metrics"] = rows
    return out


def _interval(diff: dict[str, Any] | None) -> str:
    if diff is None or diff.get("mean") is None:
        return "–"
    if diff.get("low") is None:
        return f"{diff['mean']:+.3g} (n {diff.get('n', 1)})"
    return f"{diff['mean']:+.3g} [{diff['low']:+.3g}, {diff['high']:+.3g}]"


def _labels(paths: list[Path]) -> list[str]:
    """Each file's name without .json, or its folder and name when two files share a name."""
    stems = [p.stem for p in paths]
    return [p.stem if stems.count(p.stem) == 1 else f"{p.parent.name}/{p.stem}" for p in paths]


def pool_main(files: list[str], out_dir: str | None = None) -> int:
    """`aepo report A.json B.json ...`: the pooled tables; with ``out_dir``, also ``out_dir/probes.json``."""
    from rich.console import Console
    from rich.table import Table

    try:
        pooled = pool(files)
    except ProbeFileError as err:
        print(f"aepo report: error: {err}")
        return 2
    console = Console()
    for probe, entry in pooled.items():
        names = _labels([Path(f["file"]) for f in entry["files"]])
        table = Table(title=f"aepo probe {probe}: a − b per checkpoint and pooled over {len(names)}",
                      caption=f"claim — {entry['claim']}")
        for column in ("metric", *names, "pooled (95% CI over checkpoints)", "above / below 0", "paper expects"):
            table.add_column(column, overflow="fold")
        for row in entry["metrics"]:
            table.add_row(row["metric"], *map(_interval, row["per_file"]), _interval(row["pooled"]),
                          f"{row['above']} / {row['below']} of {len(names)}", row["expected"])
        console.print(table)
        for name, f in zip(names, entry["files"]):
            console.print(f"- {name}: {f['model']} ({f['task']})")
    if out_dir is not None:
        out = Path(out_dir) / "probes.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(pooled, indent=1) + "\n")
        print(f"wrote {out}")
    return 0
