"""lab/study/figures.py draws the study's three figures from an `aepo compare` folder, every run of it."""

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("study_figures",
                                              Path(__file__).parents[1] / "lab" / "study" / "figures.py")
figures = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(figures)


def fake_compare(root: Path, tree_arms=("arpo", "aepo"), chain_arms=("grpo",), seeds=2, steps=12) -> Path:
    runs = {}
    for arm in (*chain_arms, *tree_arms):
        runs[arm] = []
        for i in range(seeds):
            run_dir = root / f"{arm}-seed{i}"
            run_dir.mkdir(parents=True)
            with open(run_dir / "metrics.jsonl", "w") as f:
                for s in range(1, steps + 1):
                    record = {"step": s, "actor/entropy": 0.5 + 0.01 * s, "actor/pg_clipfrac_high_entropy": 0.05,
                              "critic/score/mean": 0.1 * i}
                    if arm in tree_arms:
                        record["rollout/branches_per_prompt"] = 2.0 + i
                    f.write(json.dumps(record) + "\n")
            row = {"run_dir": str(run_dir), "seed_index": i, "pass@1": 0.4, "hop1:pass@1": 0.5 + 0.01 * i,
                   "hop2:pass@1": 0.3, "hop3:pass@1": 0.2}
            shares = (0.7, 0.2, 0.07, 0.03) if arm in tree_arms else (0, 0, 0, 0)  # chains log zeros
            row.update({f"rollout/consecutive_branch_share/{lv}": share for lv, share in zip(figures.LEVELS, shares)})
            row["branches"] = 3.0 if arm in tree_arms else 0.0
            runs[arm].append(row)
    (root / "compare.json").write_text(json.dumps({"arms": {a: {} for a in runs}, "runs": runs}))
    (root / "sft").mkdir()
    (root / "sft" / "eval.json").write_text(json.dumps({"sft": {  # as aepo compare writes it
        "synthetic/test": {"pass@1": 0.35,
                           "by_hops": {"1": {"pass@1": 0.49}, "2": {"pass@1": 0.26}, "3": {"pass@1": 0.24}}}}}))
    return root


def test_three_figures_from_a_compare_folder(tmp_path):
    compare = fake_compare(tmp_path / "compare")
    assert figures.main([str(compare), str(tmp_path / "out"), "--prefix", "x"]) == 0
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["x_branches.png", "x_curves.png", "x_hops.png"]
    assert all((tmp_path / "out" / name).stat().st_size > 10_000 for name in written)
    runs, sft = figures.read_compare(compare)
    assert list(runs) == ["grpo", "arpo", "aepo"] and sft["by_hops"]["3"]["pass@1"] == 0.24


def test_chain_arms_only_draw_no_branch_histogram(tmp_path):
    compare = fake_compare(tmp_path / "compare", tree_arms=())
    figures.main([str(compare), str(tmp_path / "out")])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["study_curves.png", "study_hops.png"]


def test_a_folder_without_finished_runs_is_refused(tmp_path):
    (tmp_path / "compare.json").write_text(json.dumps({"arms": {"grpo": {}}, "runs": {}}))
    with pytest.raises(SystemExit):
        figures.main([str(tmp_path), str(tmp_path / "out")])
