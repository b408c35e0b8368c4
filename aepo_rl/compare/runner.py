"""`aepo compare`'s orchestration: the shared SFT stage under a file lock, every arm × seed run (a finished one
kept), then compare.json, compare.md, the plots and the console tables."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import time
from pathlib import Path

import yaml

from aepo_rl.compare.arms import Arm, arm_configs, as_arms
from aepo_rl.compare.columns import columns_of, eval_metrics, run_metrics
from aepo_rl.compare.plots import plot_preset_means
from aepo_rl.compare.stats import paired_differences, sft_row, summarize
from aepo_rl.compare.tables import _console_tables, markdown_table, paired_table, seed_table, time_table
from aepo_rl.config import Config, ConfigError, from_dict, to_yaml
from aepo_rl.progress import PhaseProgress
from aepo_rl.report import plot_runs
from aepo_rl.tasks import get_task
from aepo_rl.train.checkpoint import atomic_write_text
from aepo_rl.train.pipeline import evaluate_model, run_rl_stage, run_sft_stage


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool = True):
    """An exclusive ``flock`` on ``path`` (created) for the ``with`` block: another `aepo compare` process on
    the same folder waits here (the SFT stage, a run, the tables). Yields whether the lock is held: with
    ``wait=False`` it is not when another process holds it. The kernel drops a killed process's lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _finished(run_dir: Path, cfg: Config, key: str = "rl") -> dict | None:
    """The evaluation ``key`` of ``run_dir``'s eval.json when the run was completed with this config,
    else None. Its config.yaml is read as a Config, so a key added to aepo-rl since (at its default)
    does not make a finished run look different."""
    try:
        if from_dict(yaml.safe_load((run_dir / "config.yaml").read_text())) != cfg:
            return None
        return json.loads((run_dir / "eval.json").read_text()).get(key)
    except (OSError, ValueError, ConfigError, TypeError, AttributeError):
        return None


def _take(run_cfg: Config, sft_model_dir: str, run_dir: Path, *, wait: bool) -> dict | None:
    """One arm × seed run under its lock (``<run_dir>.lock``): its result when another process finished it
    meanwhile, else the run from the SFT model (resuming from its newest checkpoint when it has one). None when
    another process holds the lock and ``wait`` is False."""
    with _locked(run_dir.with_name(f"{run_dir.name}.lock"), wait=wait) as mine:
        if not mine:
            return None
        finished = _finished(run_dir, run_cfg)
        if finished is not None:
            return finished
        atomic_write_text(run_dir / "config.yaml", to_yaml(run_cfg))
        return run_rl_stage(run_cfg, sft_model_dir, run_dir)


def compare_main(cfg: Config, presets: list[Arm | str] | dict[str, int], seeds: int, steps: int | None = None,
                 out_dir: str | None = None, reference: str | None = None, table_only: bool = False) -> int:
    """`aepo compare`: SFT once, then RL for every arm × seed; table, JSON, markdown and plots.

    ``presets``: :class:`Arm` objects or preset names (``seeds`` runs each), or ``{preset: runs}``. Run again
    with the same ``out_dir``, it keeps what is done: the SFT model and its evaluation, every run whose
    ``eval.json`` holds its final evaluation under the same config, and an interrupted run resumes from
    its newest checkpoint. Another process may run the same or other arms in the same ``out_dir`` at the
    same time: the first builds and evaluates the SFT model while the other waits (a file lock); each run
    has its own lock, so a process takes the runs no other holds and then waits for the others' to read
    their results; each writes the tables of its own arms (``table_only`` over the union tabulates them
    all). ``reference`` (default ``aepo`` when compared, else the first arm): the arm the paired
    differences are taken against. ``table_only``: train nothing, tabulate the runs finished so far.
    """
    arms = as_arms(presets, seeds)
    names = [arm.name for arm in arms]
    seeds = max(arm.seeds for arm in arms)
    reference = reference or ("aepo" if "aepo" in names else names[0])
    if reference not in names:
        raise ConfigError(f"--reference {reference!r} is not among the compared arms ({', '.join(names)})")
    if table_only and not out_dir:
        raise ConfigError("--table-only needs --out: the folder of the comparison to tabulate")
    out = Path(out_dir) if out_dir else Path(cfg.trainer.run_dir) / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    configs = arm_configs(cfg, arms, steps)
    sft_model_dir = str(out / "sft" / "checkpoints" / "sft")
    if table_only:
        sft_eval = _finished(out / "sft", cfg, "sft")
        if sft_eval is None:
            raise ConfigError(f"{out}: no evaluated SFT model made with this config in {out / 'sft'}; run the "
                              "comparison (without --table-only) first, with the same common overrides")
    else:
        with _locked(out / "sft.lock"):  # a second process on this folder waits for the first one's SFT model
            sft_eval = _finished(out / "sft", cfg, "sft")
            if sft_eval is None:
                atomic_write_text(out / "sft" / "config.yaml", to_yaml(cfg))
            sft_model_dir = run_sft_stage(cfg, out / "sft")
            # cfg shares eval.*, model.*, task.* and rollout.seed with the seed-0 runs: their final evaluation's
            # settings
            if sft_eval is None:
                sft_eval = evaluate_model(cfg, sft_model_dir, get_task(cfg))
                atomic_write_text(out / "sft" / "eval.json", json.dumps({"sft": sft_eval}, indent=2))
    folders = {(name, index): out / f"{name}-seed{index}" for name, index in configs}
    results: dict[tuple[str, int], dict] = {}
    missing, elsewhere = [], []
    with PhaseProgress("compare", len(configs), unit="runs") as progress:
        # a run another process holds is left to it and waited for once this process's own runs are done,
        # so two processes can share one arm's seeds
        for key, run_cfg in configs.items():
            label = f"{key[0]} seed {key[1]}"
            result = _finished(folders[key], run_cfg)
            if result is None and table_only:
                missing.append(folders[key].name)
                progress.advance(info=f"{label} not finished")
                continue
            if result is None:
                result = _take(run_cfg, sft_model_dir, folders[key], wait=False)
                if result is None:
                    elsewhere.append(key)
                    continue
            results[key] = result
            progress.advance(info=f"{label} done")
        for key in elsewhere:  # its result once the other process lets go (or the run, if that process stopped)
            results[key] = _take(configs[key], sft_model_dir, folders[key], wait=True)
            progress.advance(info=f"{key[0]} seed {key[1]} done (another process ran it)")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    run_dirs = []
    for (name, index), run_cfg in configs.items():  # in the configs' order, whichever process ran each
        if (name, index) not in results:
            continue
        run_dir = folders[name, index]
        runs[name].append({"seed": run_cfg.trainer.seed, "seed_index": index, "run_dir": str(run_dir),
                           "tree": run_cfg.rollout.mode != "independent",
                           **run_metrics(results[name, index], run_cfg.eval.split, run_dir)})
        run_dirs.append(run_dir)
    num_steps = next(iter(configs.values())).trainer.steps
    sft_metrics = eval_metrics(sft_eval, cfg.eval.split, out / "sft")
    columns = columns_of([sft_metrics, *(row for rows in runs.values() for row in rows)])
    summary = {"sft": sft_row(sft_metrics, columns), **summarize(runs, columns)}
    diffs = paired_differences(runs, reference, columns)
    with _locked(out / "tables.lock"):  # another process on this folder may be writing its tables
        atomic_write_text(out / "compare.json", json.dumps(
            {"arms": {arm.name: dataclasses.asdict(arm) for arm in arms},
             "seeds": {arm.name: arm.seeds for arm in arms}, "steps": num_steps, "sft_model": str(sft_model_dir),
             "columns": [dataclasses.asdict(c) for c in columns],
             "summary": summary, "reference": reference, "paired_differences": diffs, "runs": runs,
             "unfinished": missing}, indent=2) + "\n")
        atomic_write_text(out / "compare.md", markdown_table(summary, seeds, num_steps, columns, arms)
                          + ("\n" + paired_table(diffs, reference, columns) if diffs else "")
                          + "\n" + seed_table(runs) + "\n" + time_table(runs)
                          + (f"\nNot finished yet (left out above): {', '.join(missing)}\n" if missing else ""))
        plot_preset_means({p: rows for p, rows in runs.items() if rows}, sft_eval, out / "plots")
        if run_dirs:
            plot_runs(run_dirs, out / "plots" / "runs")
    _console_tables(summary, columns,
                    f"compare: {seeds} seed(s) × {num_steps} steps" + ("" if seeds > 1 else " (n=1: no CI)"))
    if diffs:
        print(paired_table(diffs, reference, columns))
    print(f"wrote {out / 'compare.json'}, {out / 'compare.md'} and {out / 'plots'}")
    return 0
