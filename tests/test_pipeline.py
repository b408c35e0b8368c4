"""`aepo train` end to end on the synthetic task with a tiny model: run folder contract, every preset."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import TINY_PIPELINE

from aepo_rl.api import train_main
from aepo_rl.config import PRESETS, from_dict, load_config
from aepo_rl.errors import UserError
from aepo_rl.train.pipeline import RunInterrupted, new_run_dir, run_rl_stage, run_sft_stage

METRIC_NAMES = ["step", "actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl",
                "actor/entropy", "actor/grad_norm", "actor/lr", "critic/score/mean", "critic/advantages/mean",
                "response_length/mean", "num_turns/mean", "tool_call_counts/mean", "timing_s/gen",
                "timing_s/update", "timing_s/step", "rollout/global_samples", "rollout/branches_per_prompt",
                "rollout/largest_subtree_share", "rollout/distinct_per_group", "actor/entropy_adv_scale/mean",
                "actor/grad_preserved_frac", "train/tokens_per_s"]


def tiny_config(tmp_path, preset="aepo", **extra):
    return load_config(preset, overrides={**TINY_PIPELINE, "trainer.run_dir": str(tmp_path / "runs"),
                                          "model.cache_dir": str(tmp_path / "cache"), **extra})


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("pipeline")
    cfg = tiny_config(tmp_path)
    assert train_main(cfg) == 0
    return cfg, tmp_path / "runs" / "tiny"


def test_run_folder_follows_the_contract(finished_run):
    cfg, run = finished_run
    assert from_dict(yaml.safe_load((run / "config.yaml").read_text())) == cfg
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for name in METRIC_NAMES:
        assert all(name in r for r in records), f"metrics.jsonl lacks {name}"
    results = json.loads((run / "eval.json").read_text())
    assert sorted(results) == ["rl", "sft"]
    for stage in ("sft", "rl"):
        entry = results[stage]["synthetic/test"]
        assert entry["k"] == 2 and entry["num_questions"] == 2
        assert 0.0 <= entry["pass@1"] <= entry["pass@k"] <= 1.0
    assert (run / "checkpoints" / "sft" / "config.json").is_file()
    assert (run / "checkpoints" / "step_000002" / "model" / "model.safetensors").is_file()
    assert (run / "checkpoints" / "step_000002" / "trainer_state.pt").is_file()
    rollouts = (run / "rollouts" / "step_2.jsonl").read_text().splitlines()
    assert len(rollouts) == 3
    assert {"response_token_ids", "loss_mask", "score", "advantage"} <= set(json.loads(rollouts[0]))
    assert list((run / "plots").glob("*.png"))
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))


def test_resuming_a_finished_run_reuses_every_stage(finished_run, capsys):
    cfg, run = finished_run
    before = (run / "metrics.jsonl").read_text()
    assert train_main(None, resume=str(run)) == 0
    assert (run / "metrics.jsonl").read_text() == before
    out = capsys.readouterr().out
    assert "SFT model found" in out and "evaluating" not in out and "held-out evaluation" in out


def test_a_new_run_refuses_an_existing_run_folder(finished_run):
    cfg, run = finished_run
    with pytest.raises(FileExistsError, match="aepo train --resume"):
        new_run_dir(cfg)


def test_a_failed_start_leaves_nothing_and_the_corrected_command_runs(tmp_path):
    broken = tiny_config(tmp_path, **{"model.path": str(tmp_path / "no-such-model"), "trainer.steps": 1})
    with pytest.raises(UserError, match="no-such-model"):
        train_main(broken)
    assert not (tmp_path / "runs" / "tiny").exists()
    fixed = tiny_config(tmp_path, **{"trainer.steps": 1, "eval.samples": 1, "trainer.tensorboard": False})
    assert train_main(fixed) == 0
    assert json.loads((tmp_path / "runs" / "tiny" / "eval.json").read_text()).keys() == {"sft", "rl"}


def test_a_folder_holding_only_a_config_is_reused_by_a_new_run(tmp_path):
    cfg = tiny_config(tmp_path)
    run = new_run_dir(cfg)
    (run / "config.yaml").write_text("left by a start killed during SFT")
    assert new_run_dir(cfg) == run
    (run / "sft_metrics.json").write_text("{}")  # a finished stage: now it is a run
    with pytest.raises(FileExistsError, match="trainer.steps"):
        new_run_dir(cfg)


def test_resume_with_more_steps_continues_the_run(finished_run, tmp_path):
    import shutil

    cfg, run = finished_run
    copy = shutil.copytree(run, tmp_path / "more")
    assert train_main(None, resume=str(copy), overrides={"trainer.steps": 3, "eval.samples": 1}) == 0
    records = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[:2] == [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert from_dict(yaml.safe_load((copy / "config.yaml").read_text())).trainer.steps == 3
    results = json.loads((copy / "eval.json").read_text())
    assert results["sft"]["synthetic/test"]["k"] == results["rl"]["synthetic/test"]["k"] == 1  # both re-evaluated
    assert (copy / "checkpoints" / "step_000003" / "trainer_state.pt").is_file()


def test_resume_refuses_a_changed_algorithm_setting_naming_it(finished_run, capsys):
    from aepo_rl.cli import main

    cfg, run = finished_run
    config_before = (run / "config.yaml").read_text()
    code = main(["train", "--resume", str(run), "algorithm.clip_ratio_high=0.5", "rollout.n=4", "trainer.steps=3"])
    err = capsys.readouterr().err
    assert code == 2 and "algorithm.clip_ratio_high, rollout.n cannot change" in err and "Traceback" not in err
    assert "trainer.steps" in err.split("accepts")[1]  # what is allowed
    assert (run / "config.yaml").read_text() == config_before
    same = main(["train", "--resume", str(run), f"rollout.n={cfg.rollout.n}"])  # an unchanged value is no change
    assert same == 0
    code = main(["train", "--resume", str(run), "trainer.steps=1"])
    assert code == 2 and "below the 2 RL steps already done" in capsys.readouterr().err


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_runs_two_rl_steps_from_the_sft_model(finished_run, tmp_path, preset):
    cfg, run = finished_run
    shaping = {"algorithm.overlong_buffer_len": 8} if preset == "dapo" else {}
    preset_cfg = tiny_config(tmp_path, preset, **shaping, **{"trainer.tensorboard": False, "eval.samples": 1})
    results = run_rl_stage(preset_cfg, str(run / "checkpoints" / "sft"), tmp_path / preset)
    assert results["synthetic/test"]["num_questions"] == 2
    records = [json.loads(line) for line in (tmp_path / preset / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_first_ctrl_c_or_sigterm_finishes_the_step_saves_and_stops(tmp_path, finished_run, monkeypatch, signum):
    cfg, run = finished_run
    import signal

    from aepo_rl.train import rl

    original_step = rl.RLTrainer.step

    def step_then_ctrl_c(self):
        metrics = original_step(self)
        signal.raise_signal(getattr(signal, signum))  # arrives while a step is in flight: the step still completes
        return metrics

    monkeypatch.setattr(rl.RLTrainer, "step", step_then_ctrl_c)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)  # SIG_IGN in a background job
    with pytest.raises(RunInterrupted) as stopped:
        run_rl_stage(tiny_config(tmp_path), str(run / "checkpoints" / "sft"), tmp_path / "stopped")
    assert stopped.value.step == 1
    assert (tmp_path / "stopped" / "checkpoints" / "step_000001" / "trainer_state.pt").is_file()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # handlers restored


def test_logger_rewrites_history_appends_steps_and_explains_missing_wandb(tmp_path, monkeypatch):
    import builtins
    import io

    from rich.console import Console

    from aepo_rl.train.logger import RunLogger

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "partial": tru')  # killed mid-write
    out = io.StringIO()
    with RunLogger(tmp_path, total_steps=3, history=[{"step": 1, "critic/score/mean": 0.5}], tensorboard=False,
                   wandb_project="aepo", console=Console(file=out, width=200)) as logger:
        logger.log(2, {"critic/score/mean": 0.25, "actor/pg_loss": float("nan"), "timing_s/step": 1.5})
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "critic/score/mean": 0.5},
                     {"step": 2, "critic/score/mean": 0.25, "actor/pg_loss": None, "timing_s/step": 1.5}]
    text = out.getvalue()
    assert "wandb is not installed" in text and "pip install -e '.[wandb]' in the aepo-rl clone" in text
    assert "step    2 | score 0.25 | pg_loss nan" in text


def test_a_real_model_with_zero_sft_epochs_skips_sft(tmp_path):
    cfg = tiny_config(tmp_path, **{"model.path": str(tmp_path / "my-model"), "sft.epochs": 0})
    assert run_sft_stage(cfg, tmp_path / "run") == str(tmp_path / "my-model")
    assert not (tmp_path / "run").exists()


def test_evaluations_between_rl_steps_change_what_is_measured_not_what_is_trained(finished_run, tmp_path):
    cfg, run = finished_run
    logged = {}
    for every in (0, 1):
        step_cfg = tiny_config(tmp_path, **{"trainer.steps": 3, "trainer.eval_every": every,
                                            "trainer.tensorboard": False})
        run_rl_stage(step_cfg, str(run / "checkpoints" / "sft"), tmp_path / f"every{every}")
        logged[every] = [json.loads(line)
                         for line in (tmp_path / f"every{every}" / "metrics.jsonl").read_text().splitlines()]
    # evaluated after steps 1 and 2; step 3's evaluation is the final one, in eval.json
    assert [sorted(k for k in r if k.startswith("eval/")) for r in logged[1]] == \
        [["eval/synthetic/test/pass@1", "eval/synthetic/test/pass@k"]] * 2 + [[]]
    assert not any(k.startswith("eval/") for r in logged[0] for k in r)
    trained = [{k: v for k, v in r.items() if not k.startswith(("eval/", "timing_s/", "train/tokens_per_s", "perf/"))}
               for r in logged[1]]
    assert trained == [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "train/tokens_per_s", "perf/"))}
                       for r in logged[0]]
