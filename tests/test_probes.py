"""`aepo probe` (docs/mechanisms.md): each probe's pairing and the properties its numbers must have."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from fakes import FakeEngine
from helpers import VaryingRewardTask, build_tiny_model

from aepo_rl import probe_pool, probes
from aepo_rl.cli import main
from aepo_rl.config import ConfigError, load_config
from aepo_rl.engines.hf import HFEngine
from aepo_rl.rollout.entropy import premonitor_global_samples
from aepo_rl.rollout.trajectory import Round, ToolCall, Trajectory


class ToolTask(VaryingRewardTask):
    """Questions answered with \\boxed{x} after a few searches (scripted by the fake engine); the reward depends on
    the response length, so groups of the tiny model get distinct scores; ``correct`` is the boxed answer."""

    def correct(self, example, response_text):
        return "\\boxed{x}" in response_text


def searches_then_answer(tokenizer, calls: int, entropy_of_call=lambda call: 1.0, answer=lambda seq: "x"):
    """A fake-engine script that reads its state from the context (so a sequence started from a copied prefix
    goes on where the prefix ends): search until ``calls`` results are in, then answer."""
    def script(seq):
        done = tokenizer.decode(seq.ctx, skip_special_tokens=False).count("<result>")
        if done < calls:
            return f"<search>q{done}</search>", entropy_of_call(done)
        return f"<answer>\\boxed{{{answer(seq)}}}</answer>", entropy_of_call(done)
    return script


def config(**rollout):
    cfg = load_config("aepo", overrides={"rollout.max_response_length": 512, "rollout.call_limit": 10,
                                         "rollout.max_tool_response_tokens": 8, "eval.batch_size": 3})
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, **rollout))


# ----------------------------------------------------------------------------------------------
# premonitor


def test_premonitor_m_follows_both_formulas_and_moves_with_the_gap(tiny_tokenizer):
    # Root segments are uncertain (entropy 3), reactions to tool results sure (0.1): H_root − H_tool > 0.
    engine = FakeEngine(tiny_tokenizer, searches_then_answer(tiny_tokenizer, 2, lambda call: 3.0 if call == 0 else 0.1))
    cfg = config(n=8)
    result = probes.run_probe("premonitor", cfg, ToolTask(), engine, probes.ProbeOptions(prompts=4, seeds=2))
    assert len(result.units) == 8  # 4 prompts × 2 seeds
    for row in result.units:
        assert row["gap_paper"] > 0 and row["m_fixed"] == 4
        for formula in ("paper", "release"):
            assert row[f"m_{formula}"] == premonitor_global_samples(8, row["h_root"], row[f"h_tool_{formula}"],
                                                                    formula=formula, beta=cfg.rollout.premonitor_beta)
            assert row[f"gap_{formula}"] == pytest.approx(row["h_root"] - row[f"h_tool_{formula}"])
    paper = result.effects[0]
    assert paper["metric"] == "m (paper) − n/2" and paper["diff"]["n"] == 4  # units are prompts, not prompt-seeds
    assert paper["diff"]["mean"] == pytest.approx(sum(r["m_paper"] - 4 for r in result.units) / 8)
    assert paper["diff"]["mean"] > 0  # a higher root entropy buys more global samples


# ----------------------------------------------------------------------------------------------
# branch-penalty


def branch_probe(tokenizer, penalty, prompts=4, seeds=2):
    engine = FakeEngine(tokenizer, searches_then_answer(tokenizer, 6))
    options = probes.ProbeOptions(prompts=prompts, seeds=seeds, n=16, global_samples=2, penalty=penalty)
    return probes.run_probe("branch-penalty", config(entropy_segment="previous"), ToolTask(), engine, options)


def test_a_large_penalty_stops_branching_at_l2(tiny_tokenizer):
    result = branch_probe(tiny_tokenizer, penalty=0.5)  # 1 − 0.5·l = 0 from l = 2 on
    assert all(row["l2plus_penalty"] == 0 for row in result.units)
    assert sum(row["l2plus_no_penalty"] for row in result.units) > 0  # without it, consecutive branching happens
    for row in result.units:
        for arm in ("penalty", "no_penalty"):
            assert sum(row[f"hist_{arm}"].values()) == row[f"branch_events_{arm}"]
            assert 0 < row[f"largest_subtree_share_{arm}"] <= 1 and row[f"distinct_answers_{arm}"] == 1
    l2 = next(e for e in result.effects if e["metric"] == "branch events at l ≥ 2 per tree")
    assert l2["diff"]["mean"] < 0 and l2["arms"] == ["penalty", "no_penalty"]


def test_branch_penalty_arms_share_their_seeds(tiny_tokenizer):
    # A vanishing λ changes no decision: with the same draws U, both arms grow the same trees, unit by unit.
    result = branch_probe(tiny_tokenizer, penalty=1e-12)
    for effect in result.effects:
        assert effect["diff"]["mean"] == 0 and effect["diff"]["ci95"] == 0
    assert any(row["l1plus_penalty"] > 0 for row in result.units)


def test_branch_penalty_is_deterministic_given_its_seeds(tiny_tokenizer):
    first, second = (branch_probe(tiny_tokenizer, penalty=0.05, prompts=3, seeds=1) for _ in range(2))
    assert json.dumps(first.to_json()) == json.dumps(second.to_json())


# ----------------------------------------------------------------------------------------------
# fork-choice


def test_fork_points_are_the_tool_results_the_parent_went_on_after():
    rounds = [Round(0, 5, 0.2, tool_call=ToolCall("search", "a", "r")),
              Round(5, 9, 0.7, tool_call=ToolCall("search", "b", "r")),
              Round(9, 12, 0.4)]
    traj = Trajectory("p", 0, None, None, [1], list(range(12)), [1] * 12, rounds=rounds)
    assert probes.fork_points(traj, "latest") == [(5, 0.7), (9, 0.4)]  # the reaction after each result decides
    assert probes.fork_points(traj, "previous") == [(5, 0.2), (9, 0.7)]  # the segment that made the call decides


def test_fork_choice_forks_one_parent_at_its_entropy_point_and_a_random_one(tiny_tokenizer, monkeypatch):
    # Reactions to the 2nd tool result are the most uncertain; a child forked there answers x, elsewhere y.
    entropy = {0: 0.5, 1: 0.5, 2: 4.0, 3: 1.0}

    def answer(seq):  # a child's "prompt" is the parent's prompt and the copied prefix
        return "x" if tiny_tokenizer.decode(list(seq.prompt)).count("<result>") == 2 else "y"
    engine = FakeEngine(tiny_tokenizer, searches_then_answer(tiny_tokenizer, 3, entropy.get, answer))
    seeds = []
    monkeypatch.setattr(probes, "reseed", lambda engine, seed: seeds.append(seed))
    result = probes.run_probe("fork-choice", config(entropy_segment="latest"), ToolTask(4), engine,
                              probes.ProbeOptions(prompts=4, seeds=2, children=2))
    assert len(result.units) == 8
    for row in result.units:
        points = [c["point"] for c in row["candidates"]]
        assert len(points) == 3 and row["random_point"] in points
        assert row["entropy_point"] == max(row["candidates"], key=lambda c: c["step_entropy"])["point"]
        assert row["entropy_point"] == points[1]  # the point after the 2nd result: its reaction has H = 4
        assert row["children_entropy"] == [True, True] and not row["parent_correct"]
        assert row["children_random"] == [row["same_point"]] * 2
    # An engine seed per batch of parents (eval.batch_size = 3 prompts) and seed; then per seed, the same engine
    # seed for both arms' children.
    assert seeds == [0, 1, 1000, 1001, 999, 999, 1999, 1999]
    effect = result.effects[0]
    assert effect["diff"]["n"] == 4 and effect["a"] == 1.0
    assert effect["diff"]["mean"] == pytest.approx(1 - sum(r["same_point"] for r in result.units) / 8)


def test_fork_choice_children_continue_the_parent_prefix(tiny_tokenizer, monkeypatch):
    from aepo_rl.rollout import tree

    seen = []
    original = tree.continue_rollout

    def spy(engine, trajectories, tools, cfg, **kw):
        seen.extend((t.parent_id, t.fork_token_index, list(t.response_token_ids)) for t in trajectories)
        original(engine, trajectories, tools, cfg, **kw)
    monkeypatch.setattr(probes, "continue_rollout", spy)
    engine = FakeEngine(tiny_tokenizer, searches_then_answer(tiny_tokenizer, 2))
    result = probes.run_probe("fork-choice", config(), ToolTask(2), engine,
                              probes.ProbeOptions(prompts=2, seeds=1, children=3))
    assert len(seen) == 2 * 2 * 3  # parents × arms × children
    for parent_id, point, prefix in seen:
        assert parent_id == 0 and len(prefix) == point
    assert all(row["success_entropy"] == 1.0 for row in result.units)


# ----------------------------------------------------------------------------------------------
# clip-gradient


def clip_probe(tokenizer, **algorithm):
    cfg = load_config("aepo", overrides={"rollout.mode": "independent", "rollout.n": 4, "trainer.batch_size": 2,
                                         "trainer.mini_batch_size": 1, "trainer.micro_batch_size": 2,
                                         "rollout.max_response_length": 16, "rollout.max_tokens_per_round": 8,
                                         "trainer.lr": 3e-2, **{f"algorithm.{k}": v for k, v in algorithm.items()}})
    model = build_tiny_model(tokenizer, seed=1)
    start = [p.detach().clone() for p in model.parameters()]
    result = probes.run_probe("clip-gradient", cfg, ToolTask(), HFEngine(model, tokenizer, seed=0),
                              probes.ProbeOptions(batches=1, stale_steps=2), model=model, tokenizer=tokenizer)
    assert all((p == s).all() for p, s in zip(model.parameters(), start))  # the checkpoint is left as it was
    return result


def test_clip_gradient_keeps_nothing_when_no_token_is_upper_clipped(tiny_tokenizer):
    result = clip_probe(tiny_tokenizer, clip_ratio_high=1e6)
    assert len(result.units) == 2  # 1 batch × 2 mini-batches
    for row in result.units:
        assert row["upper_clipped_tokens"] == 0 and row["extra_grad_norm"] == 0
        assert row["d_entropy_sg"] == row["d_entropy_hard"]
    assert any(row["hard_grad_norm"] > 0 for row in result.units)  # there was a gradient to keep part of
    assert result.effects == []


def test_clip_gradient_measures_the_kept_gradient_when_tokens_are_upper_clipped(tiny_tokenizer):
    result = clip_probe(tiny_tokenizer, clip_ratio_high=1e-3, entropy_adv_coef=0.0)
    clipped = [row for row in result.units if row["upper_clipped_tokens"] > 0]
    assert clipped
    for row in clipped:
        assert row["norm_share"] > 0 and math.isclose(row["norm_share"], row["extra_grad_norm"] / row["hard_grad_norm"])
    share = result.effects[0]
    assert share["diff"]["n"] == len(clipped) and share["diff"]["mean"] > 0
    entropy = result.effects[1]
    assert entropy["diff"]["mean"] == pytest.approx(sum(r["d_entropy_sg"] - r["d_entropy_hard"] for r in clipped)
                                                    / len(clipped))


def test_objective_gradient_matches_a_finite_difference(tiny_tokenizer):
    """The first-order effects are directional derivatives: ∇H·v ≈ (H(θ + εv) − H(θ − εv)) / 2ε."""
    import torch

    from aepo_rl.train.rl import FixedTensors, batched_logprobs, collate

    cfg = load_config("aepo")
    model = build_tiny_model(tiny_tokenizer, seed=2).double()
    trajs = [Trajectory("p", i, None, None, [3, 4, 5], [7 + i, 8, 9, 10 + i], [1, 1, 0, 1], [-1.0] * 4)
             for i in range(3)]
    batch = collate(trajs, [0, 0, 0], tiny_tokenizer.pad_token_id)
    rows = torch.arange(3)
    old, ent = batched_logprobs(model, batch, rows, 2, False)
    fixed = FixedTensors(old, ent, advantages=torch.ones_like(old))
    params = [p for p in model.parameters() if p.requires_grad]
    g_entropy, _, counts = probes._objective_gradients(model, params, batch, rows, fixed, cfg)
    assert counts["tokens"] == 9
    noise = torch.randn(g_entropy.shape, generator=torch.Generator().manual_seed(0), dtype=g_entropy.dtype)
    direction = g_entropy / g_entropy.norm() + noise / noise.norm()  # a derivative well above float32 rounding
    direction /= direction.norm()

    def mean_entropy(step):
        with torch.no_grad():
            offset = 0
            for p in params:
                p.add_(step * direction[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            _, h = batched_logprobs(model, batch, rows, 2, False)
            offset = 0
            for p in params:
                p.sub_(step * direction[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        return float((h * batch.response_mask).sum() / batch.response_mask.sum())

    eps = 1e-2  # the entropies are float32 (response_logprobs): a step this size is far above their rounding
    assert float(g_entropy @ direction) == pytest.approx((mean_entropy(eps) - mean_entropy(-eps)) / (2 * eps), rel=1e-2)


# ----------------------------------------------------------------------------------------------
# The command


@pytest.mark.parametrize("argv, message", [
    (["probe", "premonitor", "--model", "/no/such/folder"], "no such folder"),
    (["probe", "branch-penalty", "--n", "4", "--global-samples", "4"], "--global-samples must be in [1, --n)"),
    (["probe", "branch-penalty", "--penalty", "0"], "the penalty must be > 0"),
    (["probe", "clip-gradient", "trainer.mini_batch_size=9"],
     "trainer.mini_batch_size=9 must be <= trainer.batch_size=8"),
    (["probe", "fork-choice", "--out", "/proc/version/x.json"], "--out"),
    (["probe", "fork-choice", "trainer.run_dir=/nonexistent"], "aepo probe measures a trained policy: pass --model"),
])
def test_bad_input_fails_before_any_model(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(probes, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_probe_is_refused(capsys):
    with pytest.raises(SystemExit) as err:
        main(["probe", "entropy-magic"])
    assert err.value.code == 2 and "invalid choice: 'entropy-magic'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown probe 'entropy-magic'"):
        probes.ProbeOptions().check("entropy-magic", load_config("aepo"))


# ----------------------------------------------------------------------------------------------
# Pooled over checkpoints: aepo report PROBE.json ...


def probe_file(path, effects, probe="clip-gradient", model="ckpt"):
    """An `aepo probe --out` file with these (metric, diff values) effects, diffs from probes.paired_effect."""
    result = probes.ProbeResult(probe, probes.CLAIMS[probe], {"model": model, "task": "synthetic"},
                                [probes.paired_effect(metric, values, None, ("a − b", ""), "> 0")
                                 for metric, values in effects], units=[])
    path.write_text(json.dumps(result.to_json()))
    return str(path)


def test_report_pools_probe_files_over_checkpoints(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # one line per table row
    files = [probe_file(tmp_path / f"s{i}.json", [("d entropy", values), ("norm", [1.0, 1.2])], model=f"m{i}")
             for i, values in enumerate(([0.19, 0.21, 0.2], [-0.31, -0.29, -0.3], [0.59, 0.61]))]
    files.append(probe_file(tmp_path / "p.json", [("m − n/2", [1.0, 2.0])], probe="premonitor"))
    pooled = probe_pool.pool(files)
    assert list(pooled) == ["clip-gradient", "premonitor"] and len(pooled["clip-gradient"]["files"]) == 3
    entropy = pooled["clip-gradient"]["metrics"][0]
    assert [d["mean"] for d in entropy["per_file"]] == pytest.approx([0.2, -0.3, 0.6])
    means = [0.2, -0.3, 0.6]  # the unit is the checkpoint: t-interval over the three files' effects
    sd = math.sqrt(sum((m - 0.5 / 3) ** 2 for m in means) / 2)
    assert entropy["pooled"]["mean"] == pytest.approx(0.5 / 3)
    assert entropy["pooled"]["ci95"] == pytest.approx(4.302652729911275 * sd / math.sqrt(3))
    assert (entropy["above"], entropy["below"]) == (2, 1)  # each file's own interval excludes 0
    assert main(["report", *files, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "pooled over 3" in out and "2 / 1 of 3" in out and "- s1: m1 (synthetic)" in out
    assert json.loads((tmp_path / "out" / "probes.json").read_text())["premonitor"]["metrics"][0]["pooled"]["n"] == 1


def test_report_refuses_a_mix_and_names_a_file_that_is_no_probe_output(tmp_path, capsys):
    good = probe_file(tmp_path / "good.json", [("norm", [1.0, 2.0])])
    assert main(["report", good, str(tmp_path)]) == 2
    assert "run folders or `aepo probe --out` JSON files, not both" in capsys.readouterr().err
    (tmp_path / "metrics.json").write_text('{"step": 1}')
    assert main(["report", good, str(tmp_path / "metrics.json")]) == 2
    assert f"{tmp_path / 'metrics.json'}: not the output of `aepo probe --out`" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such file" in capsys.readouterr().out
