"""`aepo probe`: AEPO's mechanisms measured one at a time on a fixed checkpoint (docs/mechanisms.md).

Each probe compares two arms on the same units, with the same seeds, and reports the paired
difference's mean with its 95% Student-t interval over the units (:func:`aepo_rl.compare.mean_ci95`):

- ``premonitor`` (§1.3): global samples m from entropy pre-monitoring, paper and release formulas,
  against the fixed split m = n/2, and m against the entropy gap H_root − H_tool_avg. Unit: a prompt.
- ``branch-penalty`` (§1.4): the AEPO rule with λ > 0 against λ = 0, the same rollout seeds: the
  consecutive-branch histogram, the largest subtree's share and the distinct answers of each tree. Unit: a prompt.
- ``fork-choice`` (§1.4): from one parent trajectory, children forked at the point the entropy term
  favours most against children forked at a uniformly random candidate point, the same sampling seeds:
  their success rate. Unit: a prompt (its parents, one per seed, averaged).
- ``clip-gradient`` (§2.3): on mini-batches whose π_old is k optimizer steps old, the gradient the
  stop-gradient clip keeps (g_sg − g_hard) against the hard clip's gradient g_hard, and its first-order
  effect on the mini-batch's entropy and on its high-entropy tokens' log-probs. Unit: a mini-batch.

A prompt seen under several seeds counts once (the mean over its seeds), so the interval is over
independent prompts. Every unit's raw values go in the JSON output.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, variance
from typing import Any, Callable

import torch
from rich.table import Table

from aepo_rl.algorithms import get_policy_loss
from aepo_rl.algorithms.losses import HIGH_ENTROPY_QUANTILE
from aepo_rl.compare.stats import mean_interval
from aepo_rl.config import Config, ConfigError
from aepo_rl.engines import build_engine, check_entropy_measure
from aepo_rl.errors import check_writable
from aepo_rl.models import check_model_dir, encode_prompt, load_policy
from aepo_rl.probe_options import CLAIMS, ProbeOptions
from aepo_rl.progress import get_console
from aepo_rl.rewards import extract_answer, normalize_answer
from aepo_rl.rollout.entropy import premonitor_global_samples
from aepo_rl.rollout.metrics import subtree_roots
from aepo_rl.rollout.trajectory import Trajectory
from aepo_rl.rollout.tree import continue_rollout, fork_copy, premonitor_probes, run_rollout, tool_entropy
from aepo_rl.tasks import get_task
from aepo_rl.tasks.base import Example, Task
from aepo_rl.train.checkpoint import find_trained_model
from aepo_rl.train.rl import (
    RLTrainer,
    accumulate_gradients,
    batched_logprobs,
    build_optimizer,
    collate,
    response_logprobs,
    train_temperature,
)


@dataclass
class ProbeResult:
    probe: str
    claim: str
    settings: dict[str, Any]
    effects: list[dict[str, Any]]
    """One row per metric: arm means, the paired difference (mean, ci95, n, low, high) and what the paper predicts."""
    units: list[dict[str, Any]]
    """Every unit's raw values."""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------------------
# Shared pieces


def paired_effect(metric: str, a: list[float], b: list[float] | None, arms: tuple[str, str],
                  expected: str) -> dict[str, Any]:
    """Means of arms a and b and the mean of their paired differences a − b with its 95% t-interval
    (``b`` None: a quantity that is itself a difference, such as the norm of g_sg − g_hard)."""
    if b is not None and len(a) != len(b):
        raise ValueError(f"{metric}: {len(a)} values against {len(b)}; a paired effect needs one pair per unit")
    diff = mean_interval(list(a) if b is None else [x - y for x, y in zip(a, b)])
    return {"metric": metric, "arms": list(arms), "a": fmean(a) if a else None, "b": fmean(b) if b else None,
            "diff": diff, "expected": expected}


def per_prompt(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """The mean of ``key`` over each prompt's rows (its seeds), in first-seen order."""
    values: dict[str, list[float]] = {}
    for row in rows:
        values.setdefault(row["prompt"], []).append(row[key])
    return {prompt: fmean(v) for prompt, v in values.items()}


def prompt_effect(rows: list[dict[str, Any]], metric: str, a_key: str, b_key: str, arms: tuple[str, str],
                  expected: str) -> dict[str, Any]:
    """:func:`paired_effect` over prompts, each the mean over its seeds."""
    a, b = per_prompt(rows, a_key), per_prompt(rows, b_key)
    return paired_effect(metric, list(a.values()), [b[p] for p in a], arms, expected)


def reseed(engine, seed: int) -> None:
    """Restart the engine's sampling stream at ``seed`` (the HF engine's torch generator), so two arms draw the
    same random numbers in the same order; an engine without one keeps its own seeding."""
    generator = getattr(engine, "generator", None)
    if generator is not None:
        generator.manual_seed(seed)


def encode(engine, examples: list[Example]) -> list[tuple[str, list[int]]]:
    return [(ex.id, encode_prompt(engine.tokenizer, ex.messages)) for ex in examples]


def chunks(items: list, size: int) -> list[list]:
    return [items[start:start + size] for start in range(0, len(items), size)]


def seeded_chunks(cfg: Config, examples: list[Example], seeds: int):
    """(seed index s, rollout seed, prompts) for every seed and every chunk of ``eval.batch_size`` prompts: the
    rollout seed of chunk c under seed s is rollout.seed + 1000·s + c."""
    for s in range(seeds):
        for c, chunk in enumerate(chunks(examples, cfg.eval.batch_size)):
            yield s, cfg.rollout.seed + 1000 * s + c, chunk


def distinct_answers(texts: list[str]) -> int:
    """Different normalized final answers among ``texts`` (responses without an answer not counted)."""
    return len({normalize_answer(a) for a in map(extract_answer, texts) if a is not None})


# ----------------------------------------------------------------------------------------------
# premonitor (§1.3)


def probe_premonitor(cfg: Config, task: Task, engine, examples: list[Example], options: ProbeOptions) -> ProbeResult:
    """m of both formulas against m = n/2 and against the gap H_root − H_tool_avg, the same probes for both."""
    from scipy import stats

    rc, n = cfg.rollout, cfg.rollout.n
    fixed = max(1, n // 2)
    rows = []
    for s, seed, chunk in seeded_chunks(cfg, examples, options.seeds):
        reseed(engine, seed)
        for ex, (h_root, traj) in zip(chunk, premonitor_probes(engine, encode(engine, chunk), task.tools(), rc,
                                                               seed=seed)):
            row = {"prompt": ex.id, "seed": s, "rollout_seed": seed, "h_root": h_root,
                   "tool_calls": traj.num_tool_calls, "m_fixed": fixed}
            for formula in ("paper", "release"):
                h_tool = tool_entropy(traj, h_root, formula)
                row[f"h_tool_{formula}"], row[f"gap_{formula}"] = h_tool, h_root - h_tool
                row[f"m_{formula}"] = premonitor_global_samples(n, h_root, h_tool, formula=formula,
                                                                beta=rc.premonitor_beta)
            rows.append(row)
    effects, notes = [], []
    for formula in ("paper", "release"):
        effects.append(prompt_effect(rows, f"m ({formula}) − n/2", f"m_{formula}", "m_fixed",
                                     (f"premonitor_{formula}", "fixed"), "≠ 0 when the gap moves the budget"))
        gaps, ms = [r[f"gap_{formula}"] for r in rows], [r[f"m_{formula}"] for r in rows]
        rho = stats.spearmanr(gaps, ms).statistic if len(set(ms)) > 1 and len(set(gaps)) > 1 else None
        moved = fmean(m != fixed for m in ms)
        notes.append(f"{formula}: Spearman ρ(gap, m) = {'n/a (m constant)' if rho is None else f'{rho:+.3f}'} "
                     f"(paper: > 0); m ≠ n/2 for {moved:.0%} of {len(rows)} prompt-seeds; gap "
                     f"mean {fmean(gaps):+.3f}, range [{min(gaps):+.3f}, {max(gaps):+.3f}]")
        if options.seeds > 1:
            notes.append(f"{formula}: {_reliability(rows, f'gap_{formula}')}")
    return ProbeResult("premonitor", CLAIMS["premonitor"],
                       {"n": n, "beta": rc.premonitor_beta, "entropy_measure": rc.entropy_measure,
                        "probe_tokens": rc.premonitor_probe_tokens}, effects, rows, notes)


def _reliability(rows: list[dict[str, Any]], key: str) -> str:
    """How much of the gap's variance is the prompt's and how much its single probe's noise: 1 − the mean
    within-prompt variance over the total variance (a one-way intraclass correlation, floored at 0)."""
    by_prompt: dict[str, list[float]] = {}
    for row in rows:
        by_prompt.setdefault(row["prompt"], []).append(row[key])
    within = [variance(values) for values in by_prompt.values() if len(values) > 1]
    total = variance([row[key] for row in rows])
    if not within or total == 0:
        return "gap reliability n/a (no prompt seen twice, or one gap for all)"
    share = max(0.0, 1 - fmean(within) / total)
    return (f"share of the gap's variance that belongs to the prompt (not to its probe's sampling): {share:.2f} "
            f"(within-prompt SD {math.sqrt(fmean(within)):.3f}, overall SD {math.sqrt(total):.3f})")


# ----------------------------------------------------------------------------------------------
# branch-penalty (§1.4)


def probe_branch_penalty(cfg: Config, task: Task, engine, examples: list[Example],
                         options: ProbeOptions) -> ProbeResult:
    """The AEPO rollout with λ = ``options.penalty`` against λ = 0, fixed m, the same seeds in both arms."""
    penalty = cfg.rollout.branch_penalty if options.penalty is None else options.penalty
    arms = (("penalty", penalty), ("no_penalty", 0.0))
    rows = []
    for s, seed, chunk in seeded_chunks(cfg, examples, options.seeds):
        per_arm = {}
        for arm, arm_penalty in arms:
            rc = dataclasses.replace(cfg.rollout, mode="aepo", n=options.n, global_samples=options.global_samples,
                                     branch_penalty=arm_penalty)
            reseed(engine, seed)
            result = run_rollout(engine, encode(engine, chunk), task.tools(), rc, seed=seed)
            events = list(zip(result.branches.streaks, result.branches.streak_groups))
            per_arm[arm] = [_tree_row(task, ex, group, [level for level, g in events if g == i])
                            for i, (ex, group) in enumerate(zip(chunk, result.groups))]
        for i, ex in enumerate(chunk):
            rows.append({"prompt": ex.id, "seed": s, "rollout_seed": seed,
                         **{f"{key}_{arm}": value for arm, _ in arms for key, value in per_arm[arm][i].items()}})
    names = ("penalty", "no_penalty")
    metrics = (("branch events at l ≥ 2 per tree", "l2plus", "< 0"),
               ("branch events at l ≥ 1 per tree", "l1plus", "< 0"),
               ("largest subtree share", "largest_subtree_share", "< 0"),
               ("distinct answers per tree", "distinct_answers", "> 0"),
               ("branch events per tree", "branch_events", "< 0"),
               ("success rate", "success", "none stated"))
    effects = [prompt_effect(rows, label, f"{key}_penalty", f"{key}_no_penalty", names, expected)
               for label, key, expected in metrics]
    notes = [f"{arm} (λ = {penalty:g}): branch events by l: " + ", ".join(
        f"l={level} {sum(r[f'hist_{arm}'][level] for r in rows)}" for level in ("0", "1", "2", "3+"))
        for arm, penalty in arms]
    settings = {"n": options.n, "global_samples": options.global_samples, "penalty": penalty,
                "penalty_scope": cfg.rollout.penalty_scope, "entropy_segment": cfg.rollout.entropy_segment}
    return ProbeResult("branch-penalty", CLAIMS["branch-penalty"], settings, effects, rows, notes)


def _tree_row(task: Task, example: Example, group: list[Trajectory], streaks: list[int]) -> dict[str, Any]:
    """One tree's branching and outcome: the l of each branch event (§1.4) and the tree's spread."""
    hist = {"0": 0, "1": 0, "2": 0, "3+": 0}
    for level in streaks:
        hist[str(level) if level < 3 else "3+"] += 1
    roots = subtree_roots(group)
    texts = [t.response_text for t in group]
    return {"hist": hist, "branch_events": len(streaks), "l1plus": sum(level >= 1 for level in streaks),
            "l2plus": sum(level >= 2 for level in streaks),
            "largest_subtree_share": max(roots.count(r) for r in set(roots)) / len(group),
            "distinct_answers": distinct_answers(texts),
            "success": fmean(bool(task.correct(example, text)) for text in texts)}


# ----------------------------------------------------------------------------------------------
# fork-choice (§1.4)


def fork_points(traj: Trajectory, entropy_segment: str) -> list[tuple[int, float]]:
    """(fork point, the step entropy that decides it) for every tool result the parent went on after (§1.2):
    ``latest``: the parent's reaction to that result; ``previous``: the segment that made the call."""
    points = []
    for k, r in enumerate(traj.rounds[:-1]):
        if r.tool_call is not None:
            points.append((r.end, (traj.rounds[k + 1] if entropy_segment == "latest" else r).step_entropy))
    return points


def probe_fork_choice(cfg: Config, task: Task, engine, examples: list[Example], options: ProbeOptions) -> ProbeResult:
    """Children of one parent forked at its highest-entropy candidate point against a uniformly random candidate."""
    rc = cfg.rollout
    by_id = {ex.id: ex for ex in examples}
    parents: dict[int, list[tuple[Trajectory, int, int]]] = {}  # per seed index: (parent, entropy point, random point)
    skipped = 0
    single = dataclasses.replace(rc, mode="independent", n=1)
    for s, seed, chunk in seeded_chunks(cfg, examples, options.seeds):
        reseed(engine, seed)
        for (parent,) in run_rollout(engine, encode(engine, chunk), task.tools(), single, seed=seed).groups:
            points = fork_points(parent, rc.entropy_segment)
            if len(points) < 2:  # no choice to make: both arms would fork at the same point
                skipped += 1
                continue
            chosen = max(points, key=lambda p: p[1])[0]  # the first of the highest on ties
            drawn = random.Random(f"{rc.seed}/{s}/{parent.prompt_id}").choice(points)[0]
            parents.setdefault(s, []).append((parent, chosen, drawn))
    rows = []
    for s, forks in parents.items():
        # Both arms: parent i's children are rows i·K … i·K + K − 1, sampled from the same engine seed.
        outcomes = {arm: _children(cfg, task, engine, [(p, points[i]) for p, *points in forks],
                                   by_id, options.children, seed=rc.seed + 1000 * s + 999)
                    for i, arm in enumerate(("entropy", "random"))}
        for (parent, chosen, drawn), entropy_kids, random_kids in zip(forks, outcomes["entropy"], outcomes["random"]):
            if chosen == drawn:  # the same point and the same seeds: the same children (batch effects aside)
                random_kids = entropy_kids
            points = fork_points(parent, rc.entropy_segment)
            rows.append({"prompt": parent.prompt_id, "seed": s, "parent_correct":
                         bool(task.correct(by_id[parent.prompt_id], parent.response_text)),
                         "candidates": [{"point": p, "step_entropy": h} for p, h in points],
                         "entropy_point": chosen, "random_point": drawn, "same_point": chosen == drawn,
                         "success_entropy": fmean(entropy_kids), "success_random": fmean(random_kids),
                         "children_entropy": entropy_kids, "children_random": random_kids})
    if not rows:
        raise ConfigError(f"fork-choice: none of {skipped} parents made two or more tool calls it went on after, so "
                          "no fork point can be chosen; probe a model that calls tools (a trained checkpoint)")
    effects = [prompt_effect(rows, "children's success rate", "success_entropy", "success_random",
                             ("entropy", "random"), "> 0")]
    notes = [f"{len(rows)} parents with ≥ 2 candidate points ({skipped} with fewer skipped); the random point was the "
             f"entropy point for {fmean(r['same_point'] for r in rows):.0%} of them (identical children, difference 0)",
             f"parents' own success rate {fmean(r['parent_correct'] for r in rows):.3f}"]
    settings = {"children": options.children, "entropy_segment": rc.entropy_segment,
                "entropy_measure": rc.entropy_measure, "temperature": rc.temperature}
    return ProbeResult("fork-choice", CLAIMS["fork-choice"], settings, effects, rows, notes)


def _children(cfg: Config, task: Task, engine, forks: list[tuple[Trajectory, int]], by_id: dict[str, Example],
              k: int, seed: int) -> list[list[bool]]:
    """Whether each of ``k`` children forked from each (parent, point) of ``forks`` answers correctly, all children
    generated row by row in ``forks`` order from the engine seed ``seed``."""
    kids = [fork_copy(parent, j + 1, point) for parent, point in forks for j in range(k)]
    reseed(engine, seed)
    for batch in chunks(kids, cfg.eval.batch_size * k):
        continue_rollout(engine, batch, task.tools(), cfg.rollout)
    return [[bool(task.correct(by_id[parent.prompt_id], kid.response_text)) for kid in kids[i * k:(i + 1) * k]]
            for i, (parent, _) in enumerate(forks)]


# ----------------------------------------------------------------------------------------------
# clip-gradient (§2.3)


def probe_clip_gradient(cfg: Config, task: Task, engine, model, tokenizer, options: ProbeOptions) -> ProbeResult:
    """For ``options.batches`` RL batches: from the checkpoint θ₀, roll out, take k optimizer steps of the
    configured update on the batch's mini-batches (θ_k), then on every mini-batch, at θ_k and with π_old = θ₀:
    g_sg (the aepo loss) and g_hard (the same with ``sg_upper_clip=false``), and the gradients of the
    mini-batch's mean entropy and of its high-entropy tokens' mean log-prob."""
    sg_cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, policy_loss="aepo",
                                                                    sg_upper_clip=True))
    hard_cfg = dataclasses.replace(sg_cfg, algorithm=dataclasses.replace(sg_cfg.algorithm, sg_upper_clip=False))
    aepo_loss = get_policy_loss("aepo")
    trainer = RLTrainer(cfg, model, tokenizer, task, engine)  # rolls out and takes the k steps as configured
    params = [p for p in model.parameters() if p.requires_grad]
    start = {name: value.detach().clone() for name, value in model.state_dict().items()}
    rows = []
    for batch_index in range(options.batches):
        model.load_state_dict(start)
        if trainer.engine_syncs:
            engine.sync_weights(model)
        trainer.optimizer, trainer.scheduler = build_optimizer(cfg, model)
        trainer.global_step = batch_index  # the rollout seed and the data order of RL step ``batch_index``
        reseed(engine, cfg.rollout.seed + batch_index)
        groups, _ = trainer.generate()
        batch, fixed, mini_batches, first_on_policy = _prepared_update(trainer, groups)
        model.train()
        for step in range(options.stale_steps):  # cycle over the first epoch's mini-batches
            trainer.optimizer_step(batch, mini_batches[step % len(mini_batches)], fixed,
                                   on_policy=first_on_policy and step == 0)
        for index, rows_index in enumerate(mini_batches):
            grads = {arm: _loss_gradient(model, params, batch, rows_index, fixed, arm_cfg, aepo_loss)
                     for arm, arm_cfg in (("sg", sg_cfg), ("hard", hard_cfg))}
            g_entropy, g_logp, counts = _objective_gradients(model, params, batch, rows_index, fixed, sg_cfg)
            extra = grads["sg"] - grads["hard"]
            hard_norm = float(grads["hard"].norm())
            rows.append({"batch": batch_index, "mini_batch": index,
                         "trained_on": sum(step % len(mini_batches) == index for step in range(options.stale_steps)),
                         **counts, "hard_grad_norm": hard_norm, "extra_grad_norm": float(extra.norm()),
                         "norm_share": float(extra.norm()) / hard_norm if hard_norm > 0 else None,
                         # first-order change of each objective along a gradient-descent step −g (per unit step)
                         "d_entropy_sg": -float(g_entropy @ grads["sg"]),
                         "d_entropy_hard": -float(g_entropy @ grads["hard"]),
                         "d_logp_high_sg": -float(g_logp @ grads["sg"]),
                         "d_logp_high_hard": -float(g_logp @ grads["hard"])})
        model.eval()
    model.load_state_dict(start)
    clipped = [r for r in rows if r["extra_grad_norm"] > 0]
    effects = []
    if clipped:
        shares = [r["norm_share"] for r in clipped if r["norm_share"] is not None]
        effects = [paired_effect("‖g_sg − g_hard‖ / ‖g_hard‖", shares, None, ("sg − hard", ""),
                                 "> 0 (the kept gradient)"),
                   paired_effect("d entropy along −g", [r["d_entropy_sg"] for r in clipped],
                                 [r["d_entropy_hard"] for r in clipped], ("sg", "hard"), "> 0"),
                   paired_effect("d log π(high-entropy tokens) along −g", [r["d_logp_high_sg"] for r in clipped],
                                 [r["d_logp_high_hard"] for r in clipped], ("sg", "hard"), "> 0")]
    notes = [f"{len(clipped)} of {len(rows)} mini-batches had tokens above the upper bound with A > 0 whose gradient "
             "the stop-gradient clip keeps (the effects are over those; the others have g_sg = g_hard exactly); "
             f"upper-clipped tokens per mini-batch {fmean(r['upper_clipped_tokens'] for r in rows):.1f}, "
             f"lower-clipped {fmean(r['lower_clipped_tokens'] for r in rows):.1f}, "
             f"of {fmean(r['tokens'] for r in rows):.0f} tokens"]
    if clipped:
        from scipy import stats

        lower = sum(r["d_entropy_sg"] < r["d_entropy_hard"] for r in clipped)
        notes.append(f"the kept gradient lowers the entropy to first order in {lower} of {len(clipped)} "
                     f"(sign test p = {stats.binomtest(lower, len(clipped)).pvalue:.3g})")
    else:
        notes.append("no upper-clipped token: raise the staleness (--stale-steps) or trainer.lr, or lower "
                     "algorithm.clip_ratio_high, to make the upper bound bind")
    settings = {"stale_steps": options.stale_steps, "update_loss": cfg.algorithm.policy_loss,
                "batch_size": cfg.trainer.batch_size,
                "mini_batch_size": cfg.trainer.mini_batch_size, "lr": cfg.trainer.lr,
                "clip_ratio_high": cfg.algorithm.clip_ratio_high,
                "entropy_adv_coef": cfg.algorithm.entropy_adv_coef,
                "grad_preserve_entropy_quantile": cfg.algorithm.grad_preserve_entropy_quantile}
    return ProbeResult("clip-gradient", CLAIMS["clip-gradient"], settings, effects, rows, notes)


def _prepared_update(trainer, groups):
    """The RL update's inputs as :meth:`RLTrainer.update` builds them: the batch, π_old / H_old / advantages,
    the first epoch's mini-batches and whether the first one's π_old comes from its own training forward."""
    trajectories = [t for g in groups for t in g.trajectories]
    group_index = [i for i, g in enumerate(groups) for _ in g.trajectories]
    batch = collate(trajectories, group_index, trainer.tokenizer.pad_token_id).to(trainer.device)
    scores = torch.tensor([s for g in groups for s in g.scores], device=trainer.device)
    mini_batches = trainer._mini_batches(batch, len(groups))[0]
    fixed, first_on_policy = trainer._old_policy(batch, trajectories, mini_batches[0])
    token_rewards, kl = trainer._rewards(batch, scores, fixed)
    fixed.advantages = trainer._advantages(batch, token_rewards, kl, trajectories, group_index)
    return batch, fixed, mini_batches, first_on_policy


def _flat_grad(params) -> Any:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])


def _loss_gradient(model, params, batch, rows, fixed, cfg: Config, policy_loss: Callable):
    """The gradient of the configured loss on mini-batch ``rows``, flat, as the trainer accumulates it."""
    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, batch, rows, fixed, cfg, policy_loss)
    grad = _flat_grad(params)
    model.zero_grad(set_to_none=True)
    return grad


def _objective_gradients(model, params, batch, rows, fixed, cfg: Config):
    """Gradients of the mini-batch's mean token entropy and of the mean log-prob of its high-entropy tokens
    (H ≥ the 0.8-quantile of its masked tokens, §7.1), flat; and the token counts of the mini-batch."""
    temperature, bf16 = train_temperature(cfg), cfg.trainer.bf16
    mask = batch.response_mask.bool()
    log_probs, entropy = batched_logprobs(model, batch, rows, cfg.trainer.micro_batch_size, bf16, temperature)
    mini = mask[rows]
    threshold = torch.quantile(entropy[rows][mini].float(), HIGH_ENTROPY_QUANTILE)
    high_total = int((entropy[rows][mini] >= threshold).sum())
    ratio = (log_probs[rows] - fixed.old_log_probs[rows]).exp()
    positive = fixed.advantages[rows] > 0
    above = ratio > 1 + cfg.algorithm.clip_ratio_high
    counts = {"tokens": int(mini.sum()), "high_entropy_tokens": high_total,
              "upper_clipped_tokens": int((above & positive & mini).sum()),
              "lower_clipped_tokens": int(((ratio < 1 - cfg.algorithm.clip_ratio_low) & (fixed.advantages[rows] < 0)
                                           & mini).sum())}
    g_entropy, g_logp = torch.zeros_like(_flat_grad(params)), torch.zeros_like(_flat_grad(params))
    for micro in torch.split(rows, cfg.trainer.micro_batch_size):
        lp, ent = response_logprobs(model, batch.rows(micro), bf16=bf16, entropy_grad=True, temperature=temperature)
        micro_mask = mask[micro]
        high = micro_mask & (ent.detach() >= threshold)
        for target, objective in ((g_entropy, (ent * micro_mask).sum() / counts["tokens"]),
                                  (g_logp, (lp * high).sum() / max(1, high_total))):
            grads = torch.autograd.grad(objective, params, retain_graph=True, allow_unused=True)
            target += torch.cat([(g if g is not None else torch.zeros_like(p)).flatten()
                                 for g, p in zip(grads, params)])
    return g_entropy, g_logp, counts


# ----------------------------------------------------------------------------------------------
# Output and the command


def print_result(result: ProbeResult) -> None:
    console = get_console()

    def number(value: float | None) -> str:
        return "–" if value is None else f"{value:+.4g}"

    table = Table(title=f"aepo probe {result.probe}", caption=f"claim — {result.claim}")
    for column in ("metric", "arm a", "arm b", "a − b (95% CI)", "n", "paper expects a − b"):
        table.add_column(column, overflow="fold")
    for e in result.effects:
        d = e["diff"]
        interval = "" if d["ci95"] is None else f" [{d['low']:+.4g}, {d['high']:+.4g}]"
        b = "" if e["b"] is None else f"{e['arms'][1]} {number(e['b'])}"
        table.add_row(e["metric"], f"{e['arms'][0]} {number(e['a'])}", b,
                      number(d["mean"]) + interval, str(d["n"]), e["expected"])
    console.print(table)
    for note in result.notes:
        console.print(f"- {note}")


def run_probe(name: str, cfg: Config, task: Task, engine, options: ProbeOptions, *, model=None,
              tokenizer=None) -> ProbeResult:
    """Run probe ``name`` on ``engine``'s policy (``model`` and ``tokenizer`` too for clip-gradient)."""
    options.check(name, cfg)
    if name == "clip-gradient":
        return probe_clip_gradient(cfg, task, engine, model, tokenizer, options)
    try:
        examples = task.examples(options.split)[:options.prompts]
    except KeyError as err:
        raise ConfigError(f"--split {options.split}: {err.args[0]}") from None
    if not examples:
        raise ConfigError(f"--split {options.split}: task '{task.name}' has no questions in that split")
    probe = {"premonitor": probe_premonitor, "branch-penalty": probe_branch_penalty,
             "fork-choice": probe_fork_choice}[name]
    return probe(cfg, task, engine, examples, options)


def probe_main(name: str, cfg: Config, options: ProbeOptions, out_file: str | None) -> int:
    """`aepo probe NAME`: every input checked before the model is loaded, then the probe, its table and its JSON."""
    options.check(name, cfg)
    check_entropy_measure(cfg)
    if out_file is not None:
        check_writable(out_file, "--out")
    if cfg.model.path is None and cfg.model.init is None:  # the tiny model's random weights rarely call a tool
        found = find_trained_model(cfg.trainer.run_dir, cfg.task.name)
        if found is None:
            raise ConfigError(f"aepo probe measures a trained policy: pass --model HF_DIR (no model trained on "
                              f"{cfg.task.name} under trainer.run_dir={cfg.trainer.run_dir}; aepo train or aepo sft "
                              "makes one)")
        print(f"no --model: probing the newest model trained on {cfg.task.name} under {cfg.trainer.run_dir}: {found}")
        cfg.model.path = str(found)
    elif cfg.model.path not in (None, "smollm2"):
        check_model_dir(cfg.model.path)
    task = get_task(cfg)
    model, tokenizer = load_policy(cfg, task)
    engine = build_engine(cfg, model, tokenizer)
    result = run_probe(name, cfg, task, engine, options, model=model, tokenizer=tokenizer)
    sizes = {"batches": options.batches} if name == "clip-gradient" else {"prompts": options.prompts,
                                                                         "seeds": options.seeds, "split": options.split}
    result.settings.update(model=cfg.model.path or cfg.model.init or "tiny model", task=task.name, preset=cfg.preset,
                           rollout_seed=cfg.rollout.seed, **sizes)
    print_result(result)
    if out_file is not None:
        out = Path(out_file)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result.to_json(), indent=1) + "\n")
        print(f"wrote {out}")
    return 0
