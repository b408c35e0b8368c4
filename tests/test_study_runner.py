"""lab/study/run.sh issues the commands lab/study/preregistration.md writes out (phases 2-3, the tables) and
the exploratory replication's, on a frozen checkout, with `python -m aepo_rl` replaced by a recorder."""

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import frozen_study

ROOT = Path(__file__).parents[1]
RUNNER = ROOT / "lab" / "study" / "run.sh"
OPTIMIZER = "trainer.mini_batch_size=1 trainer.ppo_epochs=2 trainer.lr=3e-4"


@pytest.fixture
def study(tmp_path):
    """A frozen checkout (a one-commit git repository), a study folder after phase 1 and registration, and a
    PYTHON that records `-m aepo_rl ARGS` (one line per call) and runs everything else with this Python."""
    src, commit, fake, calls = frozen_study(tmp_path, {"f": "x"})
    out = tmp_path / "study"
    (out / "phase1").mkdir(parents=True)
    (out / "commit.txt").write_text(commit + "\n")
    (out / "preregistration.txt").write_text("f3bea550996525b2620a9281e947afcd2afe9633\n")
    (out / "phase1" / "decision.json").write_text(json.dumps({"chosen": "C7"}))
    (out / "phase1" / "optimizer.txt").write_text(OPTIMIZER + "\n")
    env = {**os.environ, "SRC": str(src), "STUDY": str(out), "PYTHON": str(fake), "POLL": "0.1"}
    return {"src": src, "out": out, "calls": calls, "env": env}


def run(study, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(RUNNER), *args], env=study["env"], capture_output=True, text=True, timeout=120)


def calls(study) -> list[str]:
    return study["calls"].read_text().splitlines() if study["calls"].exists() else []


COMMON = (f"task.max_hops=3 rollout.max_response_length=384 sft.max_length=768 model.tiny_num_layers=3 "
          f"task.teacher_error_rate=0.25 model.path={{out}}/phase0/checkpoints/sft sft.epochs=0 trainer.batch_size=8 "
          f"rollout.n=8 rollout.temperature=0.9 {OPTIMIZER} eval.samples=8")


def test_phases_2_and_3_run_the_preregistered_commands(study):
    common = COMMON.format(out=study["out"])
    result = run(study, "phase2")
    assert result.returncode == 0, result.stderr
    compare = f"--steps 100 --out {study['out']}/compare {common}"
    assert sorted(calls(study)) == sorted(f"compare --presets {arms} {compare}"
                                          for arms in ("arpo:4", "grpo:8", "aepo:8", "arpo:8"))
    study["calls"].unlink()
    assert run(study, "phase3").returncode == 0
    assert sorted(calls(study)) == sorted(f"compare --presets {arms} {compare}"
                                          for arms in ("gppo:5,aepo_no_sg_clip:5",
                                                       "aepo_no_branch_penalty:5,arpo_random:5"))


def test_the_replication_runs_in_its_own_folder_in_world_1(study):
    result = run(study, "replicate")
    assert result.returncode == 0, result.stderr
    compare = f"--steps 100 --out {study['out']}/replicate {COMMON.format(out=study['out'])} task.seed=1"
    assert sorted(calls(study)) == sorted(f"compare --presets {arms} {compare}"
                                          for arms in ("arpo:2", "grpo:4", "aepo:4", "arpo:4"))
    assert "exploratory" in (study["out"] / "logs" / "run.log").read_text()


def test_phases_refuse_an_unregistered_study_or_a_changed_checkout(study):
    (study["out"] / "preregistration.txt").unlink()
    for phase in ("phase2", "phase3", "replicate"):
        result = run(study, phase)
        assert result.returncode != 0 and "pre-registration" in result.stderr
    (study["out"] / "preregistration.txt").write_text("f3bea55\n")
    (study["src"] / "f").write_text("changed")
    result = run(study, "replicate")
    assert result.returncode != 0 and "local changes" in result.stderr
    assert calls(study) == []


def test_tables_write_the_verdicts_and_the_figures(study):
    spec = importlib.util.spec_from_file_location("study_figures_test", ROOT / "tests" / "test_study_figures.py")
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    (fixtures.fake_compare(study["out"] / "replicate") / "compare.md").write_text("| arm |\n")
    result = run(study, "replicate-tables")
    assert result.returncode == 0, result.stderr
    compare = f"--steps 100 --out {study['out']}/replicate {COMMON.format(out=study['out'])} task.seed=1"
    assert calls(study) == [f"compare --table-only --presets grpo:4,arpo:4,aepo:4 --reference {ref} {compare}"
                            for ref in ("arpo", "grpo", "aepo")]
    tables = study["out"] / "replicate" / "tables"
    assert sorted(p.name for p in tables.iterdir()) == sorted(
        [f"reference-{ref}.{ext}" for ref in ("aepo", "arpo", "grpo") for ext in ("md", "json")]
        + ["verdicts.json", "verdicts.md"])
    verdicts = json.loads((tables / "verdicts.json").read_text())
    assert verdicts[0]["claim"] == "H1" and verdicts[0]["n"] == 2
    assert sorted(p.name for p in (study["out"] / "replicate" / "plots").iterdir()) == [
        "replicate_branches.png", "replicate_curves.png", "replicate_hops.png"]


def _has(commit: str, path: str) -> bool:
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}:{path}"], capture_output=True)
    return found.returncode == 0


@pytest.mark.parametrize("commit, path", [("f3bea550996525b2620a9281e947afcd2afe9633", "docs/preregistration.md"),
                                          ("HEAD", "lab/study/preregistration.md")])
def test_register_finds_the_preregistration_before_and_after_it_moved_to_the_lab(study, commit, path):
    if not _has(commit, path):
        pytest.skip(f"this clone has no {commit}:{path} (a shallow clone)")
    (study["out"] / "preregistration.txt").unlink()
    result = run(study, "register", commit)
    assert result.returncode == 0, result.stderr
    full = subprocess.run(["git", "-C", str(ROOT), "rev-parse", commit], capture_output=True, text=True).stdout.strip()
    assert (study["out"] / "preregistration.txt").read_text().strip() == full


def test_register_refuses_a_commit_without_the_preregistration(study):
    first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                           text=True).stdout.split()[0]
    (study["out"] / "preregistration.txt").unlink()
    result = run(study, "register", first)
    assert result.returncode != 0 and "has no lab/study/preregistration.md" in result.stderr
