"""Evaluation: pass@1 and pass@k from K independent samples per question (§5).

Each question gets K independent tool-using trajectories (no branching) sampled with the
evaluation settings of §5 (temperature 0.6, top_p 0.95, top_k 20), or one greedy trajectory.
A trajectory is correct when ``task.correct(example, response_text)`` says so; pass@k is the
unbiased estimator of Chen et al. (2021) averaged over questions.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from aepo_rl.config import Config, ConfigError
from aepo_rl.engines import build_engine
from aepo_rl.engines.base import SamplingParams
from aepo_rl.engines.openai import OpenAIEngine
from aepo_rl.errors import check_writable
from aepo_rl.models import encode_prompt, load_policy
from aepo_rl.progress import PhaseProgress, get_console
from aepo_rl.rollout.metrics import tool_error_warning
from aepo_rl.rollout.trajectory import Trajectory
from aepo_rl.rollout.tree import run_rollout
from aepo_rl.tasks import get_task
from aepo_rl.tasks.base import Example, Task, split_tools

log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, §5).

    pass@k = 1 − C(n−c, k) / C(n, k), computed as the stable product
    1 − Π_{i=n−c+1}^{n} (1 − k/i), which never forms the (huge) binomial coefficients.
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    failure = 1.0
    for i in range(n - c + 1, n + 1):
        failure *= 1.0 - k / i
    return 1.0 - failure


def eval_sampling(cfg: Config) -> SamplingParams:
    """§5 evaluation sampling (temperature 0.6, top_p 0.95, top_k 20), or greedy."""
    if cfg.eval.greedy:
        return SamplingParams(greedy=True)
    return SamplingParams(temperature=cfg.eval.temperature, top_p=cfg.eval.top_p, top_k=cfg.eval.top_k)


def score_groups(task: Task, examples: list[Example], groups: list[list[Trajectory]],
                 k: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Metrics over questions (pass@1, pass@k, means over all samples) and one record per question.

    ``tool_errors/mean`` is the mean number of failed tool calls per sample (``ToolCall.error``),
    next to ``tool_calls/mean``; each sample's record has its ``tool_errors`` count. A task with
    ``answer_scores(example, text) -> {name: score}`` (phantomwiki: its EM and F1) gets each score per
    sample and its mean, ``answer/<name>/mean``. The tool efficiency, the entropy of the samples and the results
    per level of the task's ``level_field`` (``hops`` unless it says otherwise; phantomwiki: ``difficulty``)
    are :func:`efficiency`'s and :func:`by_level`'s (docs/evaluation.md)."""
    if len(groups) != len(examples):
        raise ValueError(f"the rollout returned {len(groups)} groups for {len(examples)} questions")
    field = getattr(task, "level_field", "hops")
    answer_scores = getattr(task, "answer_scores", None)
    records = []
    for example, group in zip(examples, groups):
        if len(group) != k:
            raise ValueError(f"question {example.id}: the rollout returned {len(group)} samples, expected {k}")
        samples = [{"correct": bool(task.correct(example, traj.response_text)),
                    "reward": float(task.reward(example, traj.response_text)),
                    **({"scores": answer_scores(example, traj.response_text)} if answer_scores else {}),
                    "tool_calls": traj.num_tool_calls, "tool_errors": sum(c.error for c in traj.tool_calls),
                    "response_length": len(traj.response_token_ids),
                    "model_tokens": sum(traj.loss_mask),
                    "entropy_sum": math.fsum(h for h, m in zip(traj.entropies, traj.loss_mask) if m),
                    "finish_reason": traj.finish_reason, "response": traj.response_text} for traj in group]
        records.append({"id": example.id, "question": example.question, "answers": example.answers,
                        "hops": example.extra_info.get("hops"), field: example.extra_info.get(field),
                        "min_tool_calls": example.extra_info.get("min_tool_calls"),
                        "num_samples": len(samples), "num_correct": sum(s["correct"] for s in samples),
                        "samples": samples})
    samples = [s for r in records for s in r["samples"]]
    metrics = {**_outcomes(records, k), "k": k, "num_questions": len(examples),
               "tool_errors/mean": _mean([s["tool_errors"] for s in samples]),
               "response_length/mean": _mean([s["response_length"] for s in samples]),
               "reward/mean": _mean([s["reward"] for s in samples]),
               **efficiency(records), f"by_{field}": by_level(records, k, field)}
    return metrics, records


def _outcomes(records: list[dict[str, Any]], k: int) -> dict[str, float]:
    """pass@1, pass@k (means over questions), tool calls per sample and the mean of each answer score
    (``answer/<name>/mean``) of ``records``."""
    samples = [s for r in records for s in r["samples"]]
    names = dict.fromkeys(name for s in samples for name in s.get("scores", {}))
    return {"pass@1": _mean([pass_at_k(r["num_samples"], r["num_correct"], 1) for r in records]),
            "pass@k": _mean([pass_at_k(r["num_samples"], r["num_correct"], k) for r in records]),
            "tool_calls/mean": _mean([s["tool_calls"] for s in samples]),
            **{f"answer/{name}/mean": _mean([s["scores"][name] for s in samples]) for name in names}}


def by_level(records: list[dict[str, Any]], k: int, field: str = "hops") -> dict[str, dict[str, float]]:
    """``{"<level>": {"num_questions", "pass@1", "pass@k", "tool_calls/mean", answer/<score>/mean …}}`` over the
    questions whose record carries ``field`` (the task's ``level_field``: the synthetic task's searches needed
    ``hops``, PhantomWiki's ``difficulty``), in level order; {} for a task without it."""
    levels: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        if record.get(field) is not None:
            levels.setdefault(int(record[field]), []).append(record)
    return {str(level): {"num_questions": len(rows), **_outcomes(rows, k)} for level, rows in sorted(levels.items())}


def efficiency(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Tool efficiency and the entropy of the evaluated samples (None where undefined).

    ``calls_per_correct``: tool calls of all samples / correct samples. ``tool_productivity``: its
    inverse, correct samples / tool calls (OTC-PO's "tool productivity"). ``excess_calls/mean``: mean
    over the correct samples of questions with ``extra_info["min_tool_calls"]`` of calls − that minimum
    (the teacher's searches + its python call). ``entropy/token_mean``: mean entropy of the model's own
    tokens (loss mask 1; tool results excluded) over all samples, each token once: the engine's
    per-token entropy (the full entropy for the HF engine); None when the engine reported none (a server
    that returns no log-probs: its entropies are NaN), not NaN shown as a number.
    """
    samples = [s for r in records for s in r["samples"]]
    calls, correct = sum(s["tool_calls"] for s in samples), sum(s["correct"] for s in samples)
    excess = [s["tool_calls"] - r["min_tool_calls"] for r in records if r["min_tool_calls"] is not None
              for s in r["samples"] if s["correct"]]
    tokens = sum(s["model_tokens"] for s in samples)
    entropy = math.fsum(s["entropy_sum"] for s in samples) / tokens if tokens else None
    return {"calls_per_correct": calls / correct if correct else None,
            "tool_productivity": correct / calls if calls else None,
            "excess_calls/mean": _mean(excess) if excess else None,
            "entropy/token_mean": entropy if entropy is not None and math.isfinite(entropy) else None}


def evaluate(engine, task: Task, examples: list[Example], cfg: Config, split_name: str,
             *, with_records: bool = False) -> dict[str, dict[str, Any]]:
    """pass@1 / pass@k of ``engine`` as the policy on ``examples``: ``{"<task>/<split>": metrics}``.

    K = ``cfg.eval.samples`` independent trajectories per question (1 when ``cfg.eval.greedy``),
    rolled out ``cfg.eval.batch_size`` questions at a time with the task's tools. With
    ``with_records`` the metrics carry ``"records"``: every question's samples and verdicts.
    """
    if not examples:
        raise ValueError(f"no questions to evaluate in {task.name}/{split_name}")
    k = 1 if cfg.eval.greedy else cfg.eval.samples
    rollout_cfg = dataclasses.replace(cfg.rollout, mode="independent", n=k)
    sampling = eval_sampling(cfg)
    tools = split_tools(task, split_name)
    groups: list[list[Trajectory]] = []
    with PhaseProgress(f"eval {task.name}/{split_name} ({k} samples each)", len(examples),
                       unit="questions") as progress:
        for start in range(0, len(examples), cfg.eval.batch_size):
            batch = examples[start:start + cfg.eval.batch_size]
            prompts = [(ex.id, encode_prompt(engine.tokenizer, ex.messages)) for ex in batch]
            result = run_rollout(engine, prompts, tools, rollout_cfg, validation=cfg.eval.greedy,
                                 sampling=sampling, seed=cfg.rollout.seed + start)
            groups.extend(result.groups)
            progress.advance(len(batch))
    metrics, records = score_groups(task, examples, groups, k)
    if with_records:
        metrics["records"] = records
    return {f"{task.name}/{split_name}": metrics}


def print_results(results: dict[str, dict[str, Any]], title: str = "evaluation") -> None:
    """A rich table: one row per "<task>/<split>"; a ``failed`` column when some tool call failed."""
    from rich.table import Table

    failed = any(m.get("tool_errors/mean", 0) > 0 for m in results.values())
    caption = "tools: tool calls per answer" + ("; failed: of them, calls that failed" if failed else "")
    table = Table(title=title, caption=caption + "; length: response tokens per answer")
    table.add_column("task/split", overflow="fold")
    columns = ("pass@1", "pass@k", "k", "questions", "tools", *(("failed",) if failed else ()), "length", "reward")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True, min_width=len(column))
    for name, m in results.items():
        errors = (f"{m['tool_errors/mean']:.2f}",) if failed else ()
        table.add_row(name, f"{m['pass@1']:.3f}", f"{m['pass@k']:.3f}", str(m["k"]), str(m["num_questions"]),
                      f"{m['tool_calls/mean']:.2f}", *errors, f"{m['response_length/mean']:.1f}",
                      f"{m['reward/mean']:.3f}")
    get_console().print(table)
    for name, m in results.items():
        extras = {key: m.get(key) for key in ("calls_per_correct", "tool_productivity", "excess_calls/mean",
                                              "entropy/token_mean", *(key for key in m if key.startswith("answer/")))}
        unset = {"entropy/token_mean": "unavailable (the engine returned no log-probs)"}
        get_console().print(f"{name}: " + ", ".join(f"{key} {unset.get(key, 'n/a') if v is None else f'{v:.3f}'}"
                                                    for key, v in extras.items()))
        for key, levels in m.items():
            if key.startswith("by_") and levels:
                field = key.removeprefix("by_")
                scores = [score for score in next(iter(levels.values())) if score.startswith("answer/")]
                table = Table(title=f"{name} per {field.removesuffix('s')} level")
                for column in (field, "questions", "pass@1", "pass@k", "tools", *(s.split("/")[1] for s in scores)):
                    table.add_column(column, justify="right")
                for level, h in levels.items():
                    table.add_row(level, str(h["num_questions"]), f"{h['pass@1']:.3f}", f"{h['pass@k']:.3f}",
                                  f"{h['tool_calls/mean']:.2f}", *(f"{h[s]:.3f}" for s in scores))
                get_console().print(table)


def eval_main(cfg: Config, out_file: str | None = None, endpoint: str | None = None,
              endpoint_model: str | None = None) -> int:
    """`aepo eval`: evaluate ``cfg.model.path`` (or an OpenAI-compatible endpoint) on ``cfg.eval.split``.

    An unwritable ``out_file`` is an error before anything is evaluated."""
    if out_file is not None:
        check_writable(out_file, "--out")
    task = get_task(cfg)
    engine = _build_policy_engine(cfg, task, endpoint, endpoint_model)
    try:
        examples = task.examples(cfg.eval.split)[:cfg.eval.num_questions]
    except KeyError as err:
        raise ConfigError(f"eval.split='{cfg.eval.split}': {err.args[0]}") from None
    if not examples:
        raise ConfigError(f"eval.split='{cfg.eval.split}': task '{task.name}' has no questions in that split")
    results = evaluate(engine, task, examples, cfg, cfg.eval.split, with_records=out_file is not None)
    records = {name: m.pop("records") for name, m in results.items() if "records" in m}
    policy = f"{endpoint_model} at {endpoint}" if endpoint else (cfg.model.init or cfg.model.path or "tiny model")
    print_results(results, title=f"pass@k of {policy}")
    for name, m in results.items():
        samples = m["num_questions"] * m["k"]
        message = tool_error_warning(round(m["tool_errors/mean"] * samples), round(m["tool_calls/mean"] * samples),
                                     cfg.rollout.tool_error_warn_share, f"the evaluation of {name}")
        if message:
            log.warning(message)
    if out_file is not None:
        out = Path(out_file)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        records_file = out.with_suffix(".records.jsonl")
        with records_file.open("w") as f:
            for name, rows in records.items():
                for row in rows:
                    f.write(json.dumps({"task": name, **row}) + "\n")
        print(f"wrote {out} and {records_file}")
    return 0


def _build_policy_engine(cfg: Config, task: Task, endpoint: str | None, endpoint_model: str | None):
    """The HF/vLLM engine over ``load_policy``'s model, or an OpenAI-compatible endpoint."""
    if endpoint is None:
        model, tokenizer = load_policy(cfg, task)
        return build_engine(cfg, model, tokenizer)
    if not endpoint_model:
        raise ConfigError("--endpoint needs --endpoint-model NAME (the model name the server serves)")
    if cfg.model.path is None:
        raise ConfigError("--endpoint needs --model TOKENIZER (a folder or hub id with the endpoint model's "
                          "tokenizer): prompts are sent as token ids")
    from transformers import AutoTokenizer

    return OpenAIEngine(endpoint, endpoint_model, AutoTokenizer.from_pretrained(cfg.model.path),
                        api_key=os.environ.get("OPENAI_API_KEY"), seed=cfg.rollout.seed)


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0
