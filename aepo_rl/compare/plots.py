"""The plots of `aepo compare`: every panel of ``aepo report`` with one curve per arm, the mean over its seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aepo_rl.report import mean_records, plot_records, read_run


def plot_preset_means(runs: dict[str, list[dict[str, Any]]], sft_eval: dict[str, dict], out_dir: Path) -> None:
    """Every panel of ``aepo report`` with one curve per preset, the mean over its seeds (the SFT
    model's evaluation at step 0 of the pass@1 panel)."""
    sft_point = {f"eval/{key}/pass@1": result["pass@1"] for key, result in sft_eval.items()}
    curves = {}
    for preset, rows in runs.items():
        records = mean_records([read_run(row["run_dir"]) for row in rows])
        if records and records[0]["step"] == 0:
            records[0] = {**sft_point, **records[0]}
        else:
            records.insert(0, {"step": 0, **sft_point})
        curves[f"{preset} (n={len(rows)})"] = records
    plot_records(curves, out_dir)
