"""Rollout metrics under verl / docs/algorithm.md §7 names."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from statistics import fmean

from aepo_rl.rollout.trajectory import Round, Trajectory


def _mean(xs: list[float]) -> float:
    return fmean(xs) if xs else 0.0


@dataclass
class BranchLog:
    """What the tree controller records about its branching decisions in one call (§1.4)."""

    consecutive_max: int = 0
    """The largest l (``penalty_scope=path``) or c (``prompt_round``) reached."""
    streaks: list[int] = field(default_factory=list)
    """l (or c) in P_t of every decision that branched."""
    streak_groups: list[int] = field(default_factory=list)
    """The prompt (index in the call) of each entry of ``streaks``."""
    decisions: int = 0
    """Decisions made (candidates visited while their prompt had fewer than n trajectories)."""
    entropy_flips: int = 0
    """Decisions whose outcome the entropy term changed: P_t ≥ τ with w·ΔH and not without it, or the
    reverse, the penalty applied in both (sign(U − τ) ≠ sign(U + w·ΔH − τ) for ARPO)."""


def branch_metrics(log: BranchLog) -> dict[str, float]:
    """Consecutive-branch count l at branch events (mean and shares of l = 0, 1, 2, ≥ 3) and the
    entropy leverage (share of decisions the entropy term flipped), §7.2; 0 when there were none."""
    events = len(log.streaks)
    shares = {f"rollout/consecutive_branch_share/l{streak}": sum(s == streak for s in log.streaks)
              for streak in (0, 1, 2)}
    shares["rollout/consecutive_branch_share/l3plus"] = sum(s >= 3 for s in log.streaks)
    return {
        "rollout/consecutive_branch_max": float(log.consecutive_max),
        "rollout/consecutive_branch_mean": _mean(log.streaks),
        **{key: count / events if events else 0.0 for key, count in shares.items()},
        "rollout/branch_decisions": float(log.decisions),
        "rollout/entropy_leverage": log.entropy_flips / log.decisions if log.decisions else 0.0,
    }


def own_rounds(traj: Trajectory) -> list[Round]:
    """Rounds this trajectory generated itself (not copied from its parent at the fork)."""
    start = traj.fork_token_index if traj.parent_id is not None else 0
    return [r for r in traj.rounds if r.start >= start]


def subtree_roots(group: list[Trajectory]) -> list[int]:
    """For each trajectory of a group, the traj_id of the global sample (or restart) it descends from."""
    roots: list[int] = []
    for traj in group:
        roots.append(traj.traj_id if traj.parent_id is None else roots[traj.parent_id])
    return roots


def rollout_metrics(groups: list[list[Trajectory]], global_samples: list[int], branches: BranchLog,
                    engine_counters: dict[str, float], gen_seconds: float) -> dict[str, float]:
    trajs = [t for g in groups for t in g]
    shares = [max(Counter(subtree_roots(g)).values()) / len(g) for g in groups if g]
    root_h = [t.rounds[0].step_entropy for t in trajs if t.parent_id is None and t.rounds]
    after_tool_h = [r.step_entropy for t in trajs for r in own_rounds(t) if r.start > 0]
    own_calls = [r.tool_call for t in trajs for r in own_rounds(t) if r.tool_call is not None]
    return {
        "rollout/global_samples": _mean(global_samples),
        "rollout/branches_per_prompt": _mean([sum(t.parent_id is not None for t in g) for g in groups]),
        "rollout/largest_subtree_share": _mean(shares),
        **branch_metrics(branches),
        "rollout/entropy_root": _mean(root_h),
        "rollout/entropy_after_tool": _mean(after_tool_h),
        "rollout/tool_calls": float(len(own_calls)),
        "rollout/tool_errors": float(sum(c.error for c in own_calls)),
        "tool_call_counts/mean": _mean([t.num_tool_calls for t in trajs]),
        "num_turns/mean": _mean([len(t.rounds) for t in trajs]),
        "response_length/mean": _mean([len(t.response_token_ids) for t in trajs]),
        "rollout/prefill_tokens": float(engine_counters.get("prefill_tokens", 0.0)),
        "rollout/decode_tokens": float(engine_counters.get("decode_tokens", 0.0)),
        "timing_s/gen": gen_seconds,
    }


def tool_error_warning(errors: float, calls: float, warn_share: float, where: str) -> str | None:
    """The warning for ``where`` ("step 3", "evaluation of task/split") when more than
    ``warn_share`` of its ``calls`` tool calls failed (``rollout.tool_error_warn_share``), else None."""
    if calls <= 0 or errors / calls <= warn_share:
        return None
    return (f"{errors / calls:.0%} of the tool calls failed in {where} ({errors:g} of {calls:g}; more than "
            f"rollout.tool_error_warn_share={warn_share:g}). A tool is likely broken (a search server down or "
            f"answering errors, a python sandbox that cannot run): scores then measure the tool, not the model. "
            f"Failed calls have \"error\": true and their error text in the trajectories' tool_call records.")
