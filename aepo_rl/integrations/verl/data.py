"""``aepo verl-data``: a task's train and validation splits as verl parquet files (needs no verl).

Rows follow verl's RL schema (docs/architecture.md, Contracts): ``data_source``, ``prompt`` (chat
messages, the tool protocol's system message first), ``ability``, ``reward_model`` = {style,
ground_truth}, ``extra_info`` = {index, split, id, question, reward}, and ``agent_name``:
``aepo_tree`` for train.parquet, ``aepo_chain`` for val.parquet. The task is any aepo task scored by a
registered reward: the built-in ``synthetic`` world, PhantomWiki, user files (``task.name=file
task.train_files=[...]``) or an evaluation set. A task whose splits search corpora of their own
(phantomwiki: one universe per split) also gets ``corpus_train.jsonl`` and ``corpus_val.jsonl``, the
documents its agent loops search (``aepo serve-search --corpus`` serves one).
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

from aepo_rl.config import Config, TaskConfig
from aepo_rl.errors import UserError
from aepo_rl.tasks.base import Example

TRAIN_AGENT, VAL_AGENT = "aepo_tree", "aepo_chain"
SPLITS = {"train": ("train", TRAIN_AGENT), "val": ("dev", VAL_AGENT)}
"""Output file stem → (the task's split, the agent loop that rolls it out)."""


def verl_row(example: Example, index: int, split: str, reward: str, agent_name: str) -> dict:
    """One example as a verl row (ground truth: the list of gold answers)."""
    return {
        "data_source": example.data_source,
        "prompt": [{"role": m["role"], "content": m["content"]} for m in example.messages],
        "ability": example.ability,
        "reward_model": {"style": "rule", "ground_truth": list(example.answers)},
        "extra_info": {"index": index, "split": split, "id": example.id, "question": example.question,
                       "reward": reward},
        "agent_name": agent_name,
    }


def task_reward(task, cfg: Config) -> str:
    """The registered reward the task scores with (what compute_score must use)."""
    name = getattr(task, "reward_name", None) or (cfg.task.reward if task.name == "synthetic" else None)
    if name is None:
        raise UserError(f"aepo verl-data: task '{cfg.task.name}' is not scored by a registered reward, so verl's "
                        "compute_score could not score it; use the synthetic task, your files (task.name=file) "
                        "or an evaluation set")
    return name


def task_overrides(cfg: Config) -> list[str]:
    """The ``custom.aepo.task.*`` overrides that give the agent loop the same task (hence the same tools)."""
    default = asdict(TaskConfig())
    out = []
    for f in fields(TaskConfig):
        value = getattr(cfg.task, f.name)
        if value != default[f.name] or f.name == "name":
            text = "[" + ",".join(str(v) for v in value) + "]" if isinstance(value, list) else value
            out.append(f"+actor_rollout_ref.rollout.custom.aepo.task.{f.name}={text}")
    return out


def write_verl_data(cfg: Config, out_dir: str | Path) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` of ``cfg.task`` under ``out_dir``; their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aepo_rl.tasks import get_task

    task = get_task(cfg)
    reward = task_reward(task, cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for stem, (split, agent) in SPLITS.items():
        try:
            examples = task.examples(split)
        except KeyError as error:
            raise UserError(f"aepo verl-data: {error.args[0]}") from None
        if not examples:
            raise UserError(f"aepo verl-data: task '{cfg.task.name}' has no {split} examples; for user files set "
                            f"task.{'train_files' if stem == 'train' else 'val_files'}=[...]")
        rows = [verl_row(e, i, stem, reward, agent) for i, e in enumerate(examples)]
        paths[stem] = out / f"{stem}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), paths[stem])
        if hasattr(task, "corpus"):
            paths[f"corpus_{stem}"] = out / f"corpus_{stem}.jsonl"
            docs = task.corpus(split)
            paths[f"corpus_{stem}"].write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs),
                                               encoding="utf-8")
    return paths


def verl_data_main(cfg: Config, out_dir: str) -> int:
    paths = write_verl_data(cfg, out_dir)
    for stem, path in paths.items():
        if stem in SPLITS:
            print(f"{path}: {stem} split, agent_name={SPLITS[stem][1]}")
        else:
            print(f"{path}: the search corpus of the {stem.removeprefix('corpus_')} split's questions "
                  f"(aepo serve-search --corpus {path})")
    print("add to your main_ppo command (the agent loop builds the same task's tools):")
    for line in task_overrides(cfg):
        print(f"  {line}")
    return 0
