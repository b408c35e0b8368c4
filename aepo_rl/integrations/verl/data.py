"""``aepo verl-data``: a task's train and validation splits as verl parquet files (needs no verl).

Rows follow verl's RL schema (docs/architecture.md, Contracts): ``data_source``, ``prompt`` (chat
messages, the tool protocol's system message first), ``ability``, ``reward_model`` = {style,
ground_truth}, ``extra_info`` = {index, split, id, question, reward}, and ``agent_name``:
``aepo_tree`` for train.parquet, ``aepo_chain`` for val.parquet. The task is any aepo task scored by a
registered reward: the built-in ``synthetic`` world, PhantomWiki, user files (``task.name=file
task.train_files=[...]``) or an evaluation set. A task whose splits search corpora of their own
(phantomwiki: one universe per split) also gets ``corpus_train.jsonl`` and ``corpus_val.jsonl``, the
documents its agent loops search (``aepo serve-search --corpus`` serves one).

The folder is self-contained: the agent loop rebuilds the task's tools from the printed ``task.*``
overrides, and the files those name are in the folder too (the task's files as its two parquet files,
which read back as the same questions; a corpus file copied), named relative to it as ``$DATA/...``
(:data:`BASE`), the variable the launch scripts set, so no path of the machine that wrote them is needed.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, fields, replace
from pathlib import Path

from aepo_rl.config import Config, TaskConfig
from aepo_rl.errors import UserError, import_extra
from aepo_rl.tasks.base import Example

TRAIN_AGENT, VAL_AGENT = "aepo_tree", "aepo_chain"
SPLITS = {"train": ("train", TRAIN_AGENT), "val": ("dev", VAL_AGENT)}
"""Output file stem → (the task's split, the agent loop that rolls it out)."""
BASE = "$DATA"
"""How the printed overrides name the output folder: the launch scripts' variable (examples/verl)."""


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


def task_overrides(cfg: Config, task: TaskConfig | None = None) -> list[str]:
    """The ``custom.aepo.task.*`` overrides that give the agent loop the same task (hence the same tools): of
    ``task`` (default ``cfg.task``; :func:`write_verl_data` gives the one that names its folder's files)."""
    task = cfg.task if task is None else task
    default = asdict(TaskConfig())
    out = []
    for f in fields(TaskConfig):
        value = getattr(task, f.name)
        if value != default[f.name] or f.name == "name":
            text = "[" + ",".join(str(v) for v in value) + "]" if isinstance(value, list) else value
            out.append(f"+actor_rollout_ref.rollout.custom.aepo.task.{f.name}={text}")
    return out


def write_verl_data(cfg: Config, out_dir: str | Path) -> tuple[dict[str, Path], TaskConfig]:
    """Write ``train.parquet`` and ``val.parquet`` of ``cfg.task`` under ``out_dir``; their paths, and the task config
    the agent loop gets, whose files are in ``out_dir`` and named ``$DATA/<file>`` (a file task reads its questions
    back from the two parquet files; a corpus file is copied beside them)."""
    pa = import_extra("pyarrow", "parquet", "aepo verl-data")
    pq = import_extra("pyarrow.parquet", "parquet", "aepo verl-data")

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
    loop_task = cfg.task
    if cfg.task.train_files or cfg.task.val_files:
        loop_task = replace(loop_task, train_files=[f"{BASE}/train.parquet"], val_files=[f"{BASE}/val.parquet"])
    if cfg.task.corpus and Path(cfg.task.corpus).is_file():
        corpus = Path(cfg.task.corpus)
        shutil.copyfile(corpus, out / f"corpus{''.join(corpus.suffixes)}")
        loop_task = replace(loop_task, corpus=f"{BASE}/corpus{''.join(corpus.suffixes)}")
    return paths, loop_task


def verl_data_main(cfg: Config, out_dir: str) -> int:
    paths, loop_task = write_verl_data(cfg, out_dir)
    for stem, path in paths.items():
        if stem in SPLITS:
            print(f"{path}: {stem} split, agent_name={SPLITS[stem][1]}")
        else:
            print(f"{path}: the search corpus of the {stem.removeprefix('corpus_')} split's questions "
                  f"(aepo serve-search --corpus {path})")
    print(f"add to your main_ppo command, with {BASE}={out_dir} (the folder holds every file they name; the agent "
          "loop builds the same task's tools from them on every node, so put it where each node reads that path):")
    for line in task_overrides(cfg, loop_task):
        print(f"  {line}")
    return 0
