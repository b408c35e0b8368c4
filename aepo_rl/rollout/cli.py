"""``aepo rollout``: one tree rollout for K prompts, written as JSONL and printed as trees (§1, §7)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from aepo_rl.config import Config
from aepo_rl.engines import build_engine, check_entropy_measure
from aepo_rl.models import encode_prompt, load_policy
from aepo_rl.rollout.trajectory import Trajectory
from aepo_rl.rollout.tree import RolloutResult, run_rollout
from aepo_rl.tasks import get_task

_RECORD_FIELDS = ("prompt_id", "traj_id", "parent_id", "fork_token_index", "prompt_token_ids", "response_token_ids",
                  "loss_mask", "logprobs", "entropies", "response_text", "num_tool_calls", "finish_reason",
                  "step_entropies", "rounds")


def _short(text: str, width: int = 32) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _label(traj: Trajectory, group: list[Trajectory], m: int, entropy_segment: str) -> str:
    """One line per trajectory: where it forked (with the H and P that decided it), its own calls, its end."""
    if traj.parent_id is None:
        kind = "global sample" if traj.traj_id < m else "restart"
        head, own = f"[bold]T{traj.traj_id}[/] {kind}", traj.rounds
    else:
        k = sum(r.end <= traj.fork_token_index for r in traj.rounds)
        # §1.2: "latest" decides on the parent's reaction to the result (its round k + 1), "previous" on round k.
        driver = group[traj.parent_id].rounds[k if entropy_segment == "latest" else k - 1]
        head = (f"[bold]T{traj.traj_id}[/] forked from T{traj.parent_id} after round {k}'s tool result "
                f"(token {traj.fork_token_index}, H={driver.step_entropy:.3f}, "
                f"P={traj.rounds[k - 1].branch_probability:.3f})")
        own = traj.rounds[k:]
    calls = [f"{r.tool_call.name}({_short(r.tool_call.arg)!r}){' ✗' if r.tool_call.error else ''}"
             for r in own if r.tool_call is not None]
    entropies = ", ".join(f"{r.step_entropy:.2f}" for r in own)
    return (f"{head} · H=[{entropies}] · calls: {', '.join(calls) or '—'} · "
            f"[cyan]{traj.finish_reason}[/] · {len(traj.response_token_ids)} tokens")


def group_tree(group: list[Trajectory], m: int, entropy_segment: str = "latest") -> Tree:
    """A rich tree of one prompt's group (m global samples): forks nested under their parents."""
    roots = sum(t.parent_id is None for t in group)
    tree = Tree(f"[bold]prompt {group[0].prompt_id}[/]: {len(group)} trajectories = {m} global samples + "
                f"{roots - m} restarts + {len(group) - roots} forks")
    nodes: dict[int, Tree] = {}
    for traj in group:
        parent = tree if traj.parent_id is None else nodes[traj.parent_id]
        nodes[traj.traj_id] = parent.add(_label(traj, group, m, entropy_segment))
    return tree


def write_rollouts(groups: list[list[Trajectory]], path: Path) -> None:
    with path.open("w") as f:
        for traj in (t for g in groups for t in g):
            record = traj.to_json()
            f.write(json.dumps({k: record[k] for k in _RECORD_FIELDS}) + "\n")


def print_rollout(result: RolloutResult, console: Console, entropy_segment: str = "latest") -> None:
    for group, m in zip(result.groups, result.global_samples):
        console.print(group_tree(group, m, entropy_segment))
    table = Table(title="rollout metrics (§7)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.metrics.items():
        table.add_row(key, f"{value:.4g}")
    console.print(table)


def rollout_main(cfg: Config, num_prompts: int, out_dir: str, random_model: bool,
                 found_model: str | Path | None = None) -> int:
    """Build task, policy and engine from ``cfg``; roll out the first K training prompts once. ``random_model``:
    no model was given or found, so the tiny model's random weights are rolled out (their trees are flat);
    ``found_model``: the trained model ``aepo rollout`` found for the task (``model.path``), to name it."""
    console = Console()
    check_entropy_measure(cfg)
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    task = get_task(cfg)
    examples = task.examples("train")[:num_prompts]
    if not examples:
        raise ValueError(f"task '{task.name}' has no training questions")
    if found_model is not None:
        console.print(f"no --model: using the newest model trained on {task.name} under {cfg.trainer.run_dir}: "
                      f"{found_model} (--model chooses another)")
    model, tokenizer = load_policy(cfg, task)
    if cfg.model.init:
        console.print(f"[yellow]model.init={cfg.model.init}: random weights (expect noise and few tool calls)[/]")
    elif random_model:
        console.print(f"[yellow]no --model, and no model trained on {task.name} under {cfg.trainer.run_dir}: a tiny "
                      "model with random weights, which rarely writes a tool call, so its trees are flat (no forks); "
                      "train one first (aepo train, or aepo sft) or pass --model HF_DIR[/]")
    engine = build_engine(cfg, model, tokenizer)
    prompts = [(ex.id, encode_prompt(tokenizer, ex.messages)) for ex in examples]
    result = run_rollout(engine, prompts, task.tools(), cfg.rollout, seed=cfg.rollout.seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_rollouts(result.groups, out / "rollouts.jsonl")
    print_rollout(result, console, cfg.rollout.entropy_segment)
    console.print(f"wrote {sum(map(len, result.groups))} trajectories to {out / 'rollouts.jsonl'}")
    return 0
