"""`aepo compare` with the SFT and RL stages replaced by scripted fakes: configs, CI math, tables."""

from __future__ import annotations

import fcntl
import json
import math

import pytest
import yaml

import aepo_rl.compare.plots
import aepo_rl.compare.runner
from aepo_rl.compare import (
    Arm,
    arm_configs,
    as_arms,
    compare_main,
    mean_ci95,
    parse_arm,
    preset_configs,
    student_t_critical,
    user_overrides,
    windowed_drift,
)
from aepo_rl.config import ConfigError, from_dict, load_config, to_yaml

# t_{0.975, df} from standard tables
T_TABLE = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 9: 2.2622, 30: 2.0423}


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_student_t_critical_matches_tables(df):
    assert student_t_critical(df) == pytest.approx(T_TABLE[df], abs=1e-4)


def test_student_t_critical_other_levels_and_bad_input():
    assert student_t_critical(5, confidence=0.90) == pytest.approx(2.0150, abs=1e-4)
    assert student_t_critical(1, confidence=0.5) == pytest.approx(1.0, abs=1e-9)  # Cauchy quartile
    with pytest.raises(ValueError, match="degrees of freedom"):
        student_t_critical(0)


def test_mean_ci95_by_hand():
    stat = mean_ci95([1.0, 2.0, 3.0, 4.0])
    s = math.sqrt((1.5**2 + 0.5**2 + 0.5**2 + 1.5**2) / 3)
    assert stat["mean"] == 2.5 and stat["n"] == 4
    assert stat["ci95"] == pytest.approx(3.182446305 * s / 2)
    assert mean_ci95([0.7]) == {"mean": 0.7, "ci95": None, "n": 1}
    assert mean_ci95([None, None]) == {"mean": None, "ci95": None, "n": 0}
    assert mean_ci95([2.0, None, 4.0])["n"] == 2


def test_common_overrides_reach_every_arm_and_never_change_what_a_preset_sets():
    cfg = load_config("aepo", overrides=["rollout.n=4", "trainer.lr=0.01", "task.num_train=10",
                                         "algorithm.clip_ratio_low=0.3", "rollout.entropy_weight=0.5",
                                         "trainer.seed=5"])
    assert user_overrides(cfg) == {"rollout.n": 4, "trainer.lr": 0.01, "task.num_train": 10, "trainer.seed": 5,
                                   "algorithm.clip_ratio_low": 0.3, "rollout.entropy_weight": 0.5}
    configs = preset_configs(cfg, ["grpo", "dapo"], seeds=2, steps=7)
    assert list(configs) == [("grpo", 0), ("grpo", 1), ("dapo", 0), ("dapo", 1)]
    for (preset, index), run_cfg in configs.items():
        assert run_cfg.preset == preset
        assert (run_cfg.rollout.n, run_cfg.trainer.batch_size, run_cfg.trainer.steps) == (4, 8, 7)
        assert (run_cfg.trainer.seed, run_cfg.rollout.seed) == (5 + index, index)
        assert (run_cfg.trainer.lr, run_cfg.task.num_train) == (0.01, 10)
        assert (run_cfg.algorithm.clip_ratio_low, run_cfg.rollout.entropy_weight) == (0.3, 0.5)  # no preset sets them
        assert run_cfg.rollout.mode == "independent"
    assert configs[("grpo", 0)].algorithm.clip_ratio_high == 0.2
    assert configs[("dapo", 0)].algorithm.clip_ratio_high == 0.28
    assert configs[("dapo", 1)].algorithm.dynamic_sampling

    # a common override of a key some compared preset sets is an error naming it, not silently dropped
    clash = load_config("aepo", overrides=["algorithm.clip_ratio_high=0.3", "rollout.mode=arpo"])
    with pytest.raises(ConfigError, match=r"rollout.mode \(set by the preset of grpo, dapo\); "
                                          r"algorithm.clip_ratio_high \(set by the preset of dapo\).*--arm"):
        preset_configs(clash, ["aepo", "grpo", "dapo"], seeds=1, steps=2)


def test_an_arms_overrides_stay_in_that_arm():
    cfg = load_config("aepo", overrides=["rollout.n=4", "trainer.lr=0.01"])
    arms = [Arm("arpo", "arpo", {}, 2), parse_arm("arpo_w0=arpo:1 rollout.entropy_weight=0", 3),
            parse_arm("grpo_n6=grpo rollout.n=6 trainer.lr=0.02", 2)]
    configs = arm_configs(cfg, arms, steps=3)
    assert list(configs) == [("arpo", 0), ("arpo", 1), ("arpo_w0", 0), ("grpo_n6", 0), ("grpo_n6", 1)]
    assert [(c.preset, c.rollout.entropy_weight, c.rollout.n, c.trainer.lr, c.trainer.steps, c.trainer.seed)
            for c in configs.values()] == [("arpo", 0.2, 4, 0.01, 3, 0), ("arpo", 0.2, 4, 0.01, 3, 1),
                                           ("arpo", 0.0, 4, 0.01, 3, 0), ("grpo", 0.2, 6, 0.02, 3, 0),
                                           ("grpo", 0.2, 6, 0.02, 3, 1)]
    # the named control preset is the same algorithm as the arm
    assert load_config("arpo_random", overrides={"rollout.n": 4, "trainer.lr": 0.01, "trainer.steps": 3}).rollout == \
        configs[("arpo_w0", 0)].rollout
    assert parse_arm("x=aepo", 3) == Arm("x", "aepo", {}, 3)


@pytest.mark.parametrize("text, message", [("arpo", "give NAME=PRESET"), ("", "give NAME=PRESET"),
                                           ("sft=grpo", "not 'sft'"), ("a b=grpo", "give NAME=PRESET"),
                                           ("x=gpro", "unknown preset 'gpro'"), ("x=grpo:0", "asks for 0 seeds"),
                                           ("x=grpo:y", "'y' is not a number of seeds"),
                                           ("x=grpo rollout.nn=3", "rollout.nn"),
                                           ("x=grpo trainer.seed=3", "sets trainer.seed")])
def test_parse_arm_rejects_bad_specs(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_arm(text, 2)


def test_arm_names_must_differ_and_a_bad_arm_config_names_its_arm():
    with pytest.raises(ConfigError, match="arm name\\(s\\) grpo given twice"):
        arm_configs(load_config(), [Arm("grpo", "grpo"), Arm("grpo", "arpo")], steps=1)
    cfg = load_config()
    with pytest.raises(ConfigError,
                       match="arm small \\(preset grpo .*mini_batch_size=4 must be <= trainer.batch_size=2"):
        arm_configs(cfg, [Arm("grpo", "grpo"), Arm("small", "grpo", {"trainer.batch_size": 2,
                                                                       "trainer.mini_batch_size": 4})], steps=1)
    # an arm that only lowers the batch carries the mini-batch down with it (the user did not set it)
    small = arm_configs(cfg, [Arm("small", "grpo", {"trainer.batch_size": 2})], steps=1)[("small", 0)]
    assert (small.trainer.batch_size, small.trainer.mini_batch_size) == (2, 2)


def test_entropy_drift_is_a_difference_of_windows():
    values = [float(i) for i in range(40)]
    assert windowed_drift(values) == pytest.approx(sum(range(20, 40)) / 20 - sum(range(10)) / 10)
    assert windowed_drift([1.0, 3.0]) == pytest.approx(2.0)  # one step against one
    assert windowed_drift([1.0, 2.0, 6.0]) == pytest.approx(3.0)  # first third against the rest
    assert windowed_drift([float(i) for i in range(15)]) == pytest.approx(sum(range(5, 15)) / 10 - sum(range(5)) / 5)
    assert windowed_drift([2.0]) is None and windowed_drift([]) is None


# scripted per (preset, seed index): final pass@1, pass@k, tool calls, entropy at the last step
SCRIPT = {
    "grpo": [(0.2, 0.5, 2.0, 0.9), (0.4, 0.6, 3.0, 0.8), (0.6, 0.7, 4.0, 0.7)],
    "aepo": [(0.5, 0.8, 1.0, 1.0), (0.5, 0.8, 1.0, 1.1), (0.8, 0.9, 1.0, 1.2)],
}
SFT_EVAL = {"pass@1": 0.1, "pass@k": 0.3, "k": 4, "num_questions": 8, "tool_calls/mean": 0.5}


@pytest.fixture
def fake_pipeline(monkeypatch):
    calls = {"sft": [], "eval": [], "rl": []}

    def run_sft_stage(cfg, run_dir):
        calls["sft"].append((cfg, run_dir))
        return str(run_dir / "model")

    def run_rl_stage(cfg, init_model_dir, run_dir):
        calls["rl"].append((cfg, init_model_dir, run_dir))
        pass1, passk, tools, final_entropy = SCRIPT[cfg.preset][cfg.trainer.seed]
        run_dir.mkdir(parents=True, exist_ok=True)
        steps = [{"step": 1, "actor/entropy": 1.0, "critic/score/mean": 0.1, "rollout/tool_calls": 10.0,
                  "rollout/decode_tokens": 100.0},
                 {"step": 2, "actor/entropy": final_entropy, "critic/score/mean": 0.2,
                  "rollout/tool_calls": 20.0 + tools,
                  "rollout/decode_tokens": 300.0, "rollout/informative_group_frac": 0.5}]
        if cfg.preset == "aepo":
            steps[0]["rollout/distinct_per_group"], steps[1]["rollout/distinct_per_group"] = 3.0, 5.0
            steps[0]["rollout/branches_per_prompt"] = 2.0
            steps[1]["rollout/branches_per_prompt"] = 4.0 + cfg.trainer.seed
            steps[1]["rollout/largest_subtree_share"] = 0.5  # logged at one step only
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
        result = {f"synthetic/{cfg.eval.split}": {
            "pass@1": pass1, "pass@k": passk, "k": 4, "num_questions": 8, "tool_calls/mean": tools,
            "entropy/token_mean": 0.5 + pass1, "calls_per_correct": tools / pass1, "tool_productivity": pass1 / tools,
            "excess_calls/mean": tools - 1.0,
            "by_hops": {"1": {"num_questions": 4, "pass@1": pass1 + 0.1, "pass@k": passk, "tool_calls/mean": 1.0},
                        "2": {"num_questions": 4, "pass@1": pass1 - 0.1, "pass@k": passk, "tool_calls/mean": 2.0}}}}
        (run_dir / "eval.json").write_text(json.dumps({"rl": result}))  # as the real stage stores it
        return result

    def evaluate_model(cfg, model_dir, task):
        assert len(calls["sft"]) == 1 and not calls["rl"], "the SFT model is evaluated after SFT, before RL"
        calls["eval"].append((cfg, model_dir, task.name))
        return {f"{task.name}/{cfg.eval.split}": SFT_EVAL}

    monkeypatch.setattr(aepo_rl.compare.runner, "run_sft_stage", run_sft_stage)
    monkeypatch.setattr(aepo_rl.compare.runner, "evaluate_model", evaluate_model)
    monkeypatch.setattr(aepo_rl.compare.runner, "run_rl_stage", run_rl_stage)
    return calls


def test_compare_main_aggregates_seeds(fake_pipeline, tmp_path, capsys):
    cfg = load_config("aepo", overrides=["rollout.n=4", "algorithm.clip_ratio_low=0.3"])
    assert compare_main(cfg, ["grpo", "aepo"], seeds=3, steps=2, out_dir=str(tmp_path)) == 0

    assert len(fake_pipeline["sft"]) == 1 and fake_pipeline["sft"][0][1] == tmp_path / "sft"
    assert [(c.preset, c.trainer.seed, d.name) for c, _, d in fake_pipeline["rl"]] == [
        ("grpo", 0, "grpo-seed0"), ("grpo", 1, "grpo-seed1"), ("grpo", 2, "grpo-seed2"),
        ("aepo", 0, "aepo-seed0"), ("aepo", 1, "aepo-seed1"), ("aepo", 2, "aepo-seed2")]
    assert {m for _, m, _ in fake_pipeline["rl"]} == {str(tmp_path / "sft" / "model")}
    assert {(c.rollout.n, c.trainer.steps) for c, _, _ in fake_pipeline["rl"]} == {(4, 2)}

    data = json.loads((tmp_path / "compare.json").read_text())
    t2 = 4.302652729749462
    grpo, aepo = data["summary"]["grpo"], data["summary"]["aepo"]
    assert grpo["pass@1"]["mean"] == pytest.approx(0.4)
    assert grpo["pass@1"]["ci95"] == pytest.approx(t2 * 0.2 / math.sqrt(3))
    assert aepo["pass@1"]["mean"] == pytest.approx(0.6)
    assert aepo["pass@1"]["ci95"] == pytest.approx(t2 * math.sqrt(0.03) / math.sqrt(3))
    assert grpo["tool_calls"]["mean"] == pytest.approx(3.0)
    assert {c.algorithm.clip_ratio_low for c, _, _ in fake_pipeline["rl"]} == {0.3}  # a common override
    assert grpo["entropy_drift"]["mean"] == pytest.approx(-0.2)  # drifts −0.1, −0.2, −0.3
    assert aepo["entropy_drift"]["mean"] == pytest.approx(0.1)  # 0.0, +0.1, +0.2
    assert aepo["entropy_drift"]["ci95"] == pytest.approx(t2 * 0.1 / math.sqrt(3))
    assert aepo["distinct_per_group"] == {"mean": 4.0, "ci95": 0.0, "n": 3}
    assert grpo["distinct_per_group"] == {"mean": None, "ci95": None, "n": 0}
    assert aepo["branches"]["mean"] == pytest.approx(3.5)  # per-run means 3, 3.5, 4 (step 2: 4 + seed)
    assert aepo["largest_subtree"] == {"mean": 0.5, "ci95": 0.0, "n": 3}
    # per hop level, tool efficiency and the evaluated answers' entropy, from eval.json
    assert grpo["hop1:pass@1"]["mean"] == pytest.approx(0.5) and grpo["hop2:tool_calls"]["mean"] == pytest.approx(2.0)
    assert grpo["eval_entropy"]["mean"] == pytest.approx(0.9) and grpo["excess_calls"]["mean"] == pytest.approx(2.0)
    assert grpo["calls_per_correct"]["mean"] == pytest.approx((2 / 0.2 + 3 / 0.4 + 4 / 0.6) / 3)
    assert grpo["tool_productivity"]["mean"] == pytest.approx((0.1 + 0.4 / 3 + 0.15) / 3)
    # training compute: sums over the steps of each run's metrics.jsonl (10 + 20 + tools; 100 + 300)
    assert grpo["train_tool_calls"]["mean"] == pytest.approx(33.0)
    assert aepo["train_tool_calls"]["mean"] == pytest.approx(31.0)
    assert grpo["train_decode_tokens"] == {"mean": 400.0, "ci95": 0.0, "n": 3}
    assert aepo["rollout/informative_group_frac"]["mean"] == pytest.approx(0.5)  # a LOGGED_MEANS metric
    assert [r["pass@k"] for r in data["runs"]["aepo"]] == [0.8, 0.8, 0.9]
    assert data["sft_model"] == str(tmp_path / "sft" / "model") and data["steps"] == 2

    md = (tmp_path / "compare.md").read_text()
    assert "| grpo | 3 | 0.400 ± 0.497 | 0.600 ± 0.248 | 3.000 ± 2.484 | 0.900 ± 0.497 |" in md
    assert "| aepo | 3 | 0.600 ± 0.430 |" in md and "mean ± 95% CI half-width" in md
    assert md.splitlines()[:5] == ["Outcomes:", "", "| arm | seeds | pass@1 | pass@k | tool_calls | eval_entropy |",
                                   "|---|---|---|---|---|---|", "| sft | 1 | 0.100 | 0.300 | 0.500 | n/a |"]
    assert "| grpo | 3 | -0.200 ± 0.248 | n/a | n/a | n/a | 0.500 ± 0.000 |" in md  # rollouts and entropy
    assert "| arm | seeds | hop1:pass@1 | hop1:pass@k | hop1:tool_calls | hop2:pass@1 |" in md
    assert "| sft | 1 | – | – |" in md and "| grpo | 3 | 33.000 ± 2.484 | 400.000 ± 0.000 |" in md
    assert (tmp_path / "plots" / "entropy.png").is_file() and (tmp_path / "plots" / "reward.png").is_file()
    assert (tmp_path / "plots" / "runs" / "entropy.png").is_file()  # every run overlaid
    # paired differences against aepo: grpo − aepo per seed = −0.3, −0.1, −0.2 → −0.2 ± t2·0.1/√3 (holds 0)
    diff = data["paired_differences"]["grpo"]["pass@1"]
    assert data["reference"] == "aepo" and diff["n"] == 3
    assert diff["mean"] == pytest.approx(-0.2) and diff["ci95"] == pytest.approx(t2 * 0.1 / math.sqrt(3))
    assert data["paired_differences"]["grpo"]["tool_calls"]["mean"] == pytest.approx(2.0)  # 1, 2, 3
    assert "| grpo | 3 | -0.200 ± 0.248 | no |" in md
    assert "| grpo | 3 | -0.200 ± 0.248 | no | -0.233 ± 0.143 | yes |" in md  # pass@k: −0.3, −0.2, −0.2
    assert "| grpo | 3 | 2.000 ± 2.484 | no | 0.000 ± 0.000 | no |" in md  # Δtrain_tool_calls, Δtrain_decode_tokens
    out = capsys.readouterr().out
    assert "compare: 3 seed(s) × 2 steps: outcomes" in out and "compare: 3 seed(s) × 2 steps: per level" in out


def test_compare_main_evaluates_the_sft_model_once(fake_pipeline, tmp_path, capsys):
    cfg = load_config("aepo", overrides=["eval.samples=4", "eval.num_questions=8"])
    compare_main(cfg, ["grpo", "aepo"], seeds=2, steps=2, out_dir=str(tmp_path))

    assert fake_pipeline["eval"] == [(cfg, str(tmp_path / "sft" / "model"), "synthetic")]
    # the settings the seed-0 runs' final evaluation uses
    for run_cfg, _, _ in fake_pipeline["rl"][::2]:
        assert (run_cfg.eval, run_cfg.model, run_cfg.task, run_cfg.rollout.seed) == (
            cfg.eval, cfg.model, cfg.task, cfg.rollout.seed)
    assert json.loads((tmp_path / "sft" / "eval.json").read_text()) == {"sft": {"synthetic/test": SFT_EVAL}}
    data = json.loads((tmp_path / "compare.json").read_text())
    assert list(data["summary"]) == ["sft", "grpo", "aepo"]
    sft = data["summary"]["sft"]
    assert {col: sft[col] for col in ("pass@1", "pass@k", "tool_calls", "eval_entropy")} == {
        "pass@1": {"mean": 0.1, "ci95": None, "n": 1}, "pass@k": {"mean": 0.3, "ci95": None, "n": 1},
        "tool_calls": {"mean": 0.5, "ci95": None, "n": 1}, "eval_entropy": {"mean": None, "ci95": None, "n": 0}}
    assert {col: sft[col] for col in ("entropy_drift", "branches", "train_tool_calls", "hop1:pass@1")} == dict.fromkeys(
        ("entropy_drift", "branches", "train_tool_calls", "hop1:pass@1"))  # RL-only, or not in the SFT evaluation
    assert "sft" not in data["runs"]
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    assert [cell.strip() for cell in rows[0].split("│")[1:-1]] == ["sft", "1", "0.100", "0.300", "0.500", "n/a"]


def test_every_run_folder_has_its_resolved_config(fake_pipeline, tmp_path):
    cfg = load_config("aepo", overrides=["rollout.n=4", "trainer.lr=0.01"])
    compare_main(cfg, ["grpo", "aepo"], seeds=2, steps=3, out_dir=str(tmp_path))

    assert from_dict(yaml.safe_load((tmp_path / "sft" / "config.yaml").read_text())) == cfg
    assert len(fake_pipeline["rl"]) == 4
    for run_cfg, _, run_dir in fake_pipeline["rl"]:
        assert from_dict(yaml.safe_load((run_dir / "config.yaml").read_text())) == run_cfg
    assert load_config("grpo", tmp_path / "grpo-seed1" / "config.yaml").trainer.seed == 1


def test_compare_main_one_seed_has_no_ci(fake_pipeline, tmp_path, capsys):
    assert compare_main(load_config(), ["aepo"], seeds=1, steps=None, out_dir=str(tmp_path)) == 0
    md = (tmp_path / "compare.md").read_text()
    assert "| aepo | 1 | 0.500 | 0.800 | 1.000 | 1.000 |" in md
    assert "| aepo | 1 | 0.000 | 4.000 | 3.000 | 0.500 | 0.500 |" in md
    assert "one seed: no confidence interval" in md
    assert "n=1: no CI" in capsys.readouterr().out
    assert fake_pipeline["rl"][0][0].trainer.steps == load_config().trainer.steps


def test_compare_main_rejects_bad_arguments(fake_pipeline, tmp_path):
    with pytest.raises(ConfigError, match="--presets is empty"):
        compare_main(load_config(), [], seeds=1, out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="--seeds must be >= 1"):
        compare_main(load_config(), ["aepo"], seeds=0, out_dir=str(tmp_path))


def test_aepo_compare_command(fake_pipeline, tmp_path):
    from aepo_rl.cli import main

    assert main(["compare", "--presets", "grpo,aepo", "--seeds", "2", "--steps", "3", "--out", str(tmp_path),
                 "rollout.n=6"]) == 0
    assert [(c.preset, c.trainer.seed, c.trainer.steps, c.rollout.n) for c, _, _ in fake_pipeline["rl"]] == [
        ("grpo", 0, 3, 6), ("grpo", 1, 3, 6), ("aepo", 0, 3, 6), ("aepo", 1, 3, 6)]
    assert list(json.loads((tmp_path / "compare.json").read_text())["arms"]) == ["grpo", "aepo"]


def test_aepo_compare_arms_on_the_command_line(fake_pipeline, tmp_path, capsys):
    from aepo_rl.cli import main

    assert main(["compare", "--arm", "grpo_n3=grpo rollout.n=3", "--arm", "aepo=aepo:1", "--seeds", "2", "--steps", "2",
                 "--out", str(tmp_path), "--reference", "grpo_n3", "rollout.n=4"]) == 0
    assert [(c.preset, c.trainer.seed, c.rollout.n) for c, _, _ in fake_pipeline["rl"]] == [
        ("grpo", 0, 3), ("grpo", 1, 3), ("aepo", 0, 4)]  # no --presets: only the arms
    assert [d.name for _, _, d in fake_pipeline["rl"]] == ["grpo_n3-seed0", "grpo_n3-seed1", "aepo-seed0"]
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["reference"] == "grpo_n3" and list(data["paired_differences"]) == ["aepo"]
    assert "- arm **grpo_n3**: preset grpo, rollout.n=3" in (tmp_path / "compare.md").read_text()
    assert main(["compare", "--presets", "grpo", "--arm", "grpo=grpo rollout.n=3", "--out", str(tmp_path)]) == 2
    assert "arm name(s) grpo given twice" in capsys.readouterr().err


def test_presets_with_their_own_seed_counts(fake_pipeline, tmp_path):
    from aepo_rl.cli import main

    assert main(["compare", "--presets", "aepo:3,grpo", "--seeds", "2", "--steps", "2", "--out", str(tmp_path)]) == 0
    assert [(c.preset, c.trainer.seed) for c, _, _ in fake_pipeline["rl"]] == [
        ("aepo", 0), ("aepo", 1), ("aepo", 2), ("grpo", 0), ("grpo", 1)]
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["seeds"] == {"aepo": 3, "grpo": 2}
    assert data["summary"]["grpo"]["pass@1"]["n"] == 2 and data["summary"]["aepo"]["pass@1"]["n"] == 3
    md = (tmp_path / "compare.md").read_text()
    assert "| aepo | 3 | 0.600 ± 0.430 |" in md and "| grpo | 2 | 0.300 ± 1.271 |" in md


@pytest.mark.parametrize("text, message", [("aepo:x", "is not <preset> or <preset>:<seeds>"),
                                           ("aepo:0", "asks for 0 seeds"), ("grpo,grpo", "appears twice"),
                                           ("gpro:3", "unknown preset 'gpro'"), (" , ", "--presets is empty")])
def test_parse_presets_rejects_bad_lists(text, message):
    from aepo_rl.compare import parse_presets

    with pytest.raises(ConfigError, match=message):
        parse_presets(text, 2)


def test_compare_again_keeps_finished_runs_and_reruns_changed_ones(fake_pipeline, tmp_path):
    cfg = load_config("aepo", overrides=["rollout.n=4"])
    compare_main(cfg, ["grpo", "aepo"], seeds=2, steps=2, out_dir=str(tmp_path))
    first = (tmp_path / "compare.md").read_text()
    fake_pipeline["rl"].clear()
    fake_pipeline["eval"].clear()
    (tmp_path / "aepo-seed1" / "eval.json").unlink()  # interrupted before its final evaluation
    compare_main(cfg, ["grpo", "aepo"], seeds=2, steps=2, out_dir=str(tmp_path))
    assert [(c.preset, c.trainer.seed) for c, _, _ in fake_pipeline["rl"]] == [("aepo", 1)]
    assert fake_pipeline["eval"] == []  # the SFT evaluation is kept too
    assert (tmp_path / "compare.md").read_text() == first
    fake_pipeline["rl"].clear()
    compare_main(cfg, ["grpo", "aepo"], seeds=2, steps=3, out_dir=str(tmp_path))  # another budget: all again
    assert len(fake_pipeline["rl"]) == 4


def test_paired_differences_use_common_seed_indices_and_say_what_separates():
    from aepo_rl.compare import COLUMNS, paired_differences, separates

    def rows(*values):
        return [{"seed_index": i, "pass@1": p1, "pass@k": pk, "tool_calls": t} for i, p1, pk, t in values]

    runs = {"a": rows((0, 0.5, 0.7, 1.0), (1, 0.6, 0.7, None)),
            "b": rows((0, 0.4, 0.7, 1.0), (1, 0.4, 0.7, 2.0), (2, 0.9, 0.9, 2.0))}
    diffs = paired_differences(runs, "b", list(COLUMNS))
    assert list(diffs) == ["a"]
    assert diffs["a"]["pass@1"]["n"] == 2 and diffs["a"]["pass@1"]["mean"] == pytest.approx(0.15)
    assert diffs["a"]["pass@k"] == {"mean": pytest.approx(0.0), "ci95": pytest.approx(0.0), "n": 2}
    assert diffs["a"]["tool_calls"]["n"] == 1  # a missing value drops its pair
    assert separates(diffs["a"]["pass@1"]) == "no"  # 0.15 ± 12.7·0.05/√2
    assert separates({"mean": 0.1, "ci95": 0.05, "n": 3}) == "yes"
    assert separates(diffs["a"]["tool_calls"]) == "–"
    assert diffs["a"]["branches"] == {"mean": None, "ci95": None, "n": 0}  # a column the runs lack


def test_the_paired_tables_cover_every_table_of_columns():
    from aepo_rl.compare import COLUMNS, TABLES, columns_of, paired_differences, paired_table

    def row(i, shift):
        return {"seed_index": i, **{c.name: shift + i * 0.01 for c in COLUMNS}, "hop2:pass@1": shift}

    runs = {"ref": [row(i, 0.0) for i in range(3)], "x": [row(i, 0.5) for i in range(3)]}
    columns = columns_of([r for rows in runs.values() for r in rows])
    assert {c.table for c in columns} == set(TABLES) and columns[-1].name == "largest_subtree"
    diffs = paired_differences(runs, "ref", columns)
    assert all(diffs["x"][c.name]["mean"] == pytest.approx(0.5) for c in columns)
    table = paired_table(diffs, "ref", columns)
    assert "Δpass@1 | separated" in table and "Δlargest_subtree | separated" in table and "Δhop2:pass@1" in table
    assert table.count("| x | 3 |") == len(TABLES) and "0.500 ± 0.000 | yes" in table


def test_preset_mean_plots_average_the_seeds(fake_pipeline, tmp_path, monkeypatch):
    drawn = {}
    monkeypatch.setattr(aepo_rl.compare.plots, "plot_records", lambda curves, out: drawn.update(curves))
    compare_main(load_config(), ["grpo", "aepo"], seeds=3, steps=2, out_dir=str(tmp_path), reference="grpo")
    assert list(drawn) == ["grpo (n=3)", "aepo (n=3)"]
    grpo = {r["step"]: r for r in drawn["grpo (n=3)"]}
    assert grpo[0] == {"step": 0, "eval/synthetic/test/pass@1": 0.1}  # the SFT model
    assert grpo[2]["actor/entropy"] == pytest.approx(0.8)  # final entropies 0.9, 0.8, 0.7
    assert grpo[2]["critic/score/mean"] == pytest.approx(0.2)
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["reference"] == "grpo" and list(data["paired_differences"]) == ["aepo"]
    with pytest.raises(ConfigError, match="--reference 'dapo' is not among the compared arms"):
        compare_main(load_config(), ["grpo"], seeds=1, steps=2, out_dir=str(tmp_path), reference="dapo")


def test_table_only_tabulates_the_finished_runs_and_trains_nothing(fake_pipeline, tmp_path, capsys):
    from aepo_rl.cli import main

    cfg = load_config("aepo", overrides=["rollout.n=4"])
    with pytest.raises(ConfigError, match="no evaluated SFT model"):
        compare_main(cfg, ["grpo", "aepo"], seeds=2, steps=2, out_dir=str(tmp_path), table_only=True)
    compare_main(cfg, ["grpo", "aepo"], seeds=2, steps=2, out_dir=str(tmp_path))
    (tmp_path / "aepo-seed1" / "eval.json").unlink()  # still running elsewhere
    # a run written by an older aepo-rl, whose config.yaml lacks a key added since (at its default)
    old = yaml.safe_load((tmp_path / "grpo-seed0" / "config.yaml").read_text())
    del old["rollout"]["min_p"]
    (tmp_path / "grpo-seed0" / "config.yaml").write_text(yaml.safe_dump(old))
    fake_pipeline["rl"].clear()
    fake_pipeline["sft"].clear()
    capsys.readouterr()
    assert main(["compare", "--presets", "grpo,aepo", "--seeds", "2", "--steps", "2", "--out", str(tmp_path),
                 "--table-only", "rollout.n=4"]) == 0
    assert fake_pipeline["rl"] == [] and fake_pipeline["sft"] == []
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["unfinished"] == ["aepo-seed1"]
    assert data["summary"]["grpo"]["pass@1"]["n"] == 2 and data["summary"]["aepo"]["pass@1"]["n"] == 1
    md = (tmp_path / "compare.md").read_text()
    assert "Not finished yet (left out above): aepo-seed1" in md
    assert "| grpo | 2 | 0 | 0 |" in md  # the fake runs log no timing_s/step
    with pytest.raises(ConfigError, match="--table-only needs --out"):
        compare_main(cfg, ["grpo"], seeds=1, table_only=True)


def test_run_time_is_the_sum_of_the_step_times(tmp_path):
    from aepo_rl.compare import run_metrics, time_table

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "timing_s/step": t}) + "\n"
                                                    for s, t in ((1, 1.5), (2, 2.0), (3, 2.5))))
    result = {"synthetic/test": {"pass@1": 0.5, "pass@k": 0.7, "tool_calls/mean": 1.0}}
    row = run_metrics(result, "test", tmp_path)
    assert row["rl_time_s"] == pytest.approx(6.0)
    assert "| grpo | 2 | 5 | 10 |" in time_table({"grpo": [row, {**row, "rl_time_s": 4.0}]})


def test_the_example_comparison_script_covers_every_compared_preset_and_ablation():
    import re
    from pathlib import Path

    from aepo_rl.compare import parse_presets

    script = (Path(__file__).parents[1] / "examples" / "compare_all.sh").read_text()
    counts = parse_presets(re.search(r"--presets (\S+)", script).group(1),
                           int(re.search(r"--seeds (\d+)", script).group(1)))
    assert {p: counts[p] for p in ("grpo", "arpo", "aepo")} == {"grpo": 5, "arpo": 5, "aepo": 5}
    others = ("reinforce_plus_plus", "dapo", "gppo", "cispo", "gigpo", "official", "aepo_no_premonitor",
              "aepo_no_branch_penalty", "aepo_no_sg_clip", "aepo_no_entropy_adv")
    assert all(counts[p] >= 3 for p in others)


def test_every_run_is_in_the_seed_table(fake_pipeline, tmp_path):
    compare_main(load_config(), {"grpo": 3, "aepo": 2}, seeds=3, steps=2, out_dir=str(tmp_path))
    md = (tmp_path / "compare.md").read_text()
    assert "| arm | seed 0 | seed 1 | seed 2 |" in md
    assert "| grpo | 0.200 / 0.500 | 0.400 / 0.600 | 0.600 / 0.700 |" in md
    assert "| aepo | 0.500 / 0.800 | 0.500 / 0.800 | – |" in md


def test_pairs_and_seed_columns_follow_the_seed_index_when_a_run_is_missing(fake_pipeline, tmp_path):
    cfg = load_config()
    compare_main(cfg, ["grpo", "aepo"], seeds=3, steps=2, out_dir=str(tmp_path))
    (tmp_path / "aepo-seed1" / "eval.json").unlink()  # not finished: aepo has seeds 0 and 2
    compare_main(cfg, ["grpo", "aepo"], seeds=3, steps=2, out_dir=str(tmp_path), table_only=True, reference="grpo")
    diff = json.loads((tmp_path / "compare.json").read_text())["paired_differences"]["aepo"]["pass@1"]
    assert diff["n"] == 2 and diff["mean"] == pytest.approx(((0.5 - 0.2) + (0.8 - 0.6)) / 2)  # seeds 0 and 2
    assert "| aepo | 0.500 / 0.800 | – | 0.800 / 0.900 |" in (tmp_path / "compare.md").read_text()


def test_logged_training_metrics_become_columns(tmp_path):
    from aepo_rl.compare import columns_of, run_metrics

    steps = [{"step": 1, "actor/pg_clipfrac": 0.1, "actor/pg_clipfrac_high_entropy": 0.3, "actor/entropy": 2.0,
              "rollout/entropy_leverage": 0.2, "actor/entropy_unique": 1.0, "actor/other": 5.0},
             {"step": 2, "actor/pg_clipfrac": 0.3, "actor/pg_clipfrac_high_entropy": 0.5, "actor/entropy": 1.0,
              "rollout/entropy_leverage": 0.4, "actor/entropy_unique": 1.5, "actor/other": 5.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    row = run_metrics({"synthetic/test": {"pass@1": 0.5, "pass@k": 0.7, "tool_calls/mean": 1.0}}, "test", tmp_path)
    assert row["actor/pg_clipfrac"] == pytest.approx(0.2)
    assert row["actor/pg_clipfrac_high_entropy"] == pytest.approx(0.4)
    assert row["rollout/entropy_leverage"] == pytest.approx(0.3) and "actor/other" not in row
    assert row["entropy_drift"] == pytest.approx(-1.0) and row["entropy_unique_drift"] == pytest.approx(0.5)
    names = [c.name for c in columns_of([row]) if c.table == "rollouts and entropy"]
    assert names == ["entropy_drift", "entropy_unique_drift", "actor/pg_clipfrac", "actor/pg_clipfrac_high_entropy",
                     "rollout/entropy_leverage"]
    assert row["train_tool_calls"] is None and "train_tool_calls" not in [c.name for c in columns_of([row])]


def test_a_branching_metric_against_an_arm_that_never_branches_is_not_separated():
    from aepo_rl.compare import COLUMNS, columns_of, paired_differences, paired_table, separates

    def row(i, tree, share):
        return {"seed_index": i, "tree": tree, "pass@1": 0.5 + 0.01 * i + (0.2 if tree else 0.0), "branches": share,
                "rollout/consecutive_branch_share/l0": share}

    runs = {"grpo": [row(i, False, 0.0) for i in range(2)], "aepo": [row(i, True, 0.3 + 0.01 * i) for i in range(2)]}
    columns = columns_of([r for rows in runs.values() for r in rows])
    diffs = paired_differences(runs, "grpo", columns)
    assert separates(diffs["aepo"]["pass@1"]) == "yes"  # measured on both: a real difference
    for name in ("branches", "rollout/consecutive_branch_share/l0"):
        assert separates(diffs["aepo"][name]) == "n/a (no tree)", name
        assert diffs["aepo"][name]["undefined"] == "grpo never branches (rollout.mode=independent)"
    assert "| aepo | 2 |" in paired_table(diffs, "grpo", columns) and len(columns) < len(COLUMNS) + 2
    trees = {"a": [row(i, True, 0.1 * i) for i in range(2)], "b": [row(i, True, 0.3) for i in range(2)]}
    assert separates(paired_differences(trees, "b", columns)["a"]["branches"]) != "n/a (no tree)"


@pytest.mark.parametrize("other_finishes", [True, False])
def test_a_run_another_process_holds_is_left_to_it_and_read_when_it_lets_go(fake_pipeline, tmp_path, monkeypatch,
                                                                            other_finishes):
    """Two processes can share one arm's seeds: a run whose lock (``<out>/<name>-seed<i>.lock``) another process
    holds is skipped, and once this process's own runs are done it waits for that lock; then it reads the run the
    other finished, or runs it itself when the other stopped first (a killed process's lock is dropped)."""
    cfg = load_config("aepo", overrides=["rollout.n=4"])
    seed0 = arm_configs(cfg, as_arms(["aepo"], 3), 2)[("aepo", 0)]
    other = (tmp_path / "aepo-seed0.lock").open("a")  # another open file: flock treats it as another process
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    ours = aepo_rl.compare.runner.run_rl_stage

    def run_rl_stage(run_cfg, init_model_dir, run_dir):
        result = ours(run_cfg, init_model_dir, run_dir)
        if run_dir.name == "aepo-seed2":  # meanwhile the other process ends seed 0 (or stops), and lets go
            if other_finishes:
                ours(seed0, init_model_dir, tmp_path / "aepo-seed0")
                fake_pipeline["rl"].pop()  # that run was the other process's
                (tmp_path / "aepo-seed0" / "config.yaml").write_text(to_yaml(seed0))
            fcntl.flock(other, fcntl.LOCK_UN)
        return result

    monkeypatch.setattr(aepo_rl.compare.runner, "run_rl_stage", run_rl_stage)
    assert compare_main(cfg, ["aepo"], seeds=3, steps=2, out_dir=str(tmp_path)) == 0
    other.close()
    ran = [d.name for _, _, d in fake_pipeline["rl"]]
    assert ran == (["aepo-seed1", "aepo-seed2"] if other_finishes else ["aepo-seed1", "aepo-seed2", "aepo-seed0"])
    data = json.loads((tmp_path / "compare.json").read_text())
    assert [r["seed_index"] for r in data["runs"]["aepo"]] == [0, 1, 2]  # the whole arm, in seed order
    assert [r["pass@k"] for r in data["runs"]["aepo"]] == [0.8, 0.8, 0.9]
