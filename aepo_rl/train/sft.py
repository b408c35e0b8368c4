"""Cold-start SFT on the task's teacher demonstrations (docs/algorithm.md §5).

A demonstration is the prompt followed by pieces of text in order: the teacher's own writing
(trained) and the tool results the environment inserted (not trained). Each piece is
tokenized on its own, exactly as the rollout sees it (model tokens, then the tool result's
tokens appended), and the response ends with the EOS token ``<|im_end|>`` (trained). The
loss is the token-mean cross-entropy over trained tokens only: prompt and tool-result tokens
have loss mask 0 (§1.1). AdamW with linear warm-up over the first ``sft.warmup_ratio`` of the
steps, then cosine decay to 0: transformers' schedule, the warm-up rule of RL too (lr·s/W at step s).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import get_cosine_schedule_with_warmup

from aepo_rl.config import ConfigError, to_yaml
from aepo_rl.engines import build_engine
from aepo_rl.evaluate import evaluate, print_results
from aepo_rl.models import apply_lora, encode_prompt, load_policy, model_device, save_policy
from aepo_rl.models.forward import decoder_hidden, lm_head
from aepo_rl.progress import PhaseProgress, get_console
from aepo_rl.protocol import ANSWER, ANSWER_CLOSE, Protocol
from aepo_rl.tasks import get_task
from aepo_rl.train.checkpoint import atomic_write_text
from aepo_rl.train.sft_data import SFTData, load_sft_data

if TYPE_CHECKING:
    from aepo_rl.config import Config
    from aepo_rl.tasks.base import Demonstration


@dataclass
class SFTSample:
    """One tokenized demonstration: ids and a 0/1 loss mask of the same length."""

    input_ids: list[int]
    loss_mask: list[int]


def tokenize_demonstration(tokenizer, demo: Demonstration, max_length: int) -> SFTSample:
    """Prompt (mask 0) + each piece (mask 1 if the model wrote it, 0 for tool results) + EOS (mask 1)."""
    ids = encode_prompt(tokenizer, demo.example.messages)
    mask = [0] * len(ids)
    for text, trained in demo.pieces:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [int(trained)] * len(piece)
    ids.append(tokenizer.eos_token_id)
    mask.append(1)
    return SFTSample(ids[:max_length], mask[:max_length])


def collate(samples: list[SFTSample], pad_id: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Right-pad a batch: ``input_ids``, ``attention_mask``, ``loss_mask`` of shape [B, T], built on the
    CPU and moved to ``device`` (the policy's) at once."""
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(samples), width), dtype=torch.float32)
    for row, s in enumerate(samples):
        n = len(s.input_ids)
        ids[row, :n] = torch.tensor(s.input_ids)
        attention[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
    return {"input_ids": ids.to(device), "attention_mask": attention.to(device), "loss_mask": loss_mask.to(device)}


def batches_for_epoch(samples: list[SFTSample], batch_size: int, rng: random.Random) -> list[list[SFTSample]]:
    """Shuffled batches of similar lengths (sorted within windows of 8 batches) to limit padding."""
    order = list(range(len(samples)))
    rng.shuffle(order)
    window = batch_size * 8
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: len(samples[i].input_ids))
        batches += [[samples[i] for i in chunk[k:k + batch_size]] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def trained_logits(model, batch: dict[str, torch.Tensor], bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [N, V] (fp32) at the N positions whose next token is trained, and those targets [N].

    The rows' common prefix (the system message) runs once (``models/forward.py``), and only
    the trained positions go through the LM head: most tokens of a demonstration are prompt or
    tool result, so this skips most of the head's work and the full-vocabulary softmax. bf16
    autocast runs on the batch's device type.
    """
    predicts_trained = batch["loss_mask"][:, 1:].bool()
    with torch.autocast(batch["input_ids"].device.type, dtype=torch.bfloat16, enabled=bf16):
        hidden = decoder_hidden(model, batch["input_ids"])
        logits = lm_head(model, hidden[:, :-1][predicts_trained])
    return logits.float(), batch["input_ids"][:, 1:][predicts_trained]


def masked_lm_loss(model, batch: dict[str, torch.Tensor], bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-mean next-token cross-entropy over trained targets; also the trained-token count."""
    logits, targets = trained_logits(model, batch, bf16)
    if not len(targets):  # every sequence was truncated before its first trained token
        return logits.sum() * 0.0, torch.tensor(0)
    return F.cross_entropy(logits, targets), torch.tensor(len(targets))


@torch.no_grad()
def token_accuracy(model, samples: list[SFTSample], tokenizer, batch_size: int, bf16: bool) -> dict[str, float]:
    """Teacher-forced accuracy on held-out demonstrations.

    ``token_accuracy``: share of trained tokens predicted by argmax. ``answer_accuracy``: share
    of demonstrations whose every token after ``<answer>`` up to and including ``</answer>``
    is predicted by argmax (the answer copied right, given the right context).
    """
    was_training = model.training
    model.eval()
    vocab = tokenizer.get_vocab()
    open_id, close_id = vocab.get(f"<{ANSWER}>"), vocab.get(ANSWER_CLOSE)
    hits = count = answers_right = answers = 0
    for start in range(0, len(samples), batch_size):
        batch = collate(samples[start:start + batch_size], tokenizer.pad_token_id, model_device(model))
        logits, targets_flat = trained_logits(model, batch, bf16)
        targets, mask = batch["input_ids"][:, 1:], batch["loss_mask"][:, 1:].bool()
        right = torch.zeros_like(mask)
        right[mask] = logits.argmax(-1) == targets_flat
        hits += int(right.sum())
        count += int(mask.sum())
        if open_id is None or close_id is None:
            continue
        # answer span in target coordinates: after the model's <answer>, through its first </answer>
        # (tags in the prompt, e.g. the system message's format example, are not trained: skipped)
        is_open, is_close = ((targets == open_id) & mask).long(), ((targets == close_id) & mask).long()
        span = (is_open.cumsum(1) - is_open > 0) & (is_close.cumsum(1) - is_close == 0) & mask
        has_span = span.any(1)
        answers += int(has_span.sum())
        answers_right += int((has_span & (right | ~span).all(1)).sum())
    model.train(was_training)
    out = {"token_accuracy": hits / max(1, count)}
    if answers:
        out["answer_accuracy"] = answers_right / answers
    return out


def run_sft(cfg: Config, model, tokenizer, demos: list[Demonstration],
            dev_demos: list[Demonstration] | None = None) -> dict:
    """Train ``model`` in place on ``demos`` (§5); returns metrics.

    With ``cfg.model.lora_rank > 0`` only LoRA adapters train and are merged into ``model``
    at the end, so ``model`` stays a plain transformers model. Metrics: ``loss_curve`` (one
    value per optimizer step), ``lr_curve``, ``final_loss`` (mean over the last epoch),
    ``tokens_per_s`` (all tokens in the batches), ``trained_tokens``, ``steps``, ``time_s``,
    and ``dev/token_accuracy`` / ``dev/answer_accuracy`` when ``dev_demos`` are given.
    """
    sft = cfg.sft
    samples = [tokenize_demonstration(tokenizer, d, sft.max_length) for d in demos]
    if not samples:
        raise ValueError("SFT got no demonstrations: the task's demonstrations() is empty")
    torch.manual_seed(cfg.trainer.seed)
    rng = random.Random(cfg.trainer.seed)
    trainable_before = {name: p.requires_grad for name, p in model.named_parameters()}
    trainee = apply_lora(model, cfg.model)
    trainee.train()
    params = [p for p in trainee.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=sft.lr, weight_decay=sft.weight_decay)
    steps_per_epoch = math.ceil(len(samples) / sft.batch_size)
    total_steps = steps_per_epoch * sft.epochs
    scheduler = get_cosine_schedule_with_warmup(optimizer, round(sft.warmup_ratio * total_steps), total_steps)
    losses: list[float] = []
    lrs: list[float] = []
    seen_tokens = trained_tokens = 0
    start = time.perf_counter()
    with PhaseProgress("SFT", total_steps) as progress:
        for epoch in range(sft.epochs):
            for batch_samples in batches_for_epoch(samples, sft.batch_size, rng):
                batch = collate(batch_samples, tokenizer.pad_token_id, model_device(model))
                loss, count = masked_lm_loss(trainee, batch, cfg.trainer.bf16)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.trainer.grad_clip)
                lrs.append(scheduler.get_last_lr()[0])
                optimizer.step()
                scheduler.step()
                losses.append(loss.item())
                seen_tokens += int(batch["attention_mask"].sum())
                trained_tokens += int(count)
                progress.advance(info=f"epoch {epoch + 1}/{sft.epochs}, loss {losses[-1]:.3f}")
    elapsed = time.perf_counter() - start
    trainee.eval()
    if trainee is not model:
        trainee.merge_and_unload()  # writes the merged weights into ``model``'s own modules
        for name, p in model.named_parameters():
            p.requires_grad_(trainable_before[name])  # peft froze the base weights
    model.eval()
    last_epoch = losses[-steps_per_epoch:] if losses else [float("nan")]
    metrics = {"loss_curve": losses, "lr_curve": lrs, "final_loss": sum(last_epoch) / len(last_epoch),
               "tokens_per_s": seen_tokens / max(elapsed, 1e-9), "trained_tokens": trained_tokens,
               "steps": total_steps, "epochs": sft.epochs, "num_demonstrations": len(samples),
               "time_s": elapsed}
    if dev_demos:
        dev = [tokenize_demonstration(tokenizer, d, sft.max_length) for d in dev_demos]
        metrics.update({f"dev/{k}": v for k, v in
                        token_accuracy(model, dev, tokenizer, sft.batch_size, cfg.trainer.bf16).items()})
    return metrics


def check_demonstrations(cfg: Config, task, data: SFTData | None) -> None:
    """Before any model is built: the user's demonstrations (``data``) call only the task's tools, or,
    without them, the task has demonstrations of its own. Notes demonstrations without an answer block."""
    if data is None:
        if not task.demonstrations():
            raise ConfigError(f"task {task.name!r} has no demonstrations for cold-start SFT: give your own (sft.data="
                              "[demos.jsonl], `aepo sft --data`, AEPOTrainer(sft_dataset=...); docs/training.md, "
                              "\"SFT on your own demonstrations\"), or set sft.epochs=0 with model.path a model "
                              "that already follows the tool protocol")
        return
    data.check_tools(Protocol(task.tools(), cfg.rollout.tool_format))
    unanswered = data.unanswered()
    if unanswered:
        get_console().print(f"[yellow]note[/]: {len(unanswered)} of {len(data.demos)} demonstrations write no "
                            "<answer>…</answer> block "
                            f"({', '.join(unanswered[:3])}{', …' if len(unanswered) > 3 else ''}): the "
                            "built-in rewards (§3) read the final answer from <answer>\\boxed{…}</answer>")


def sft_demonstrations(cfg: Config, task, data: SFTData | None, tokenizer) -> tuple[list[Demonstration],
                                                                                   list[Demonstration]]:
    """The demonstrations to train on and the held-out ones: the user's (``data``, in the task's protocol,
    none held out), else the task's own and its dev split's."""
    if data is None:
        return task.demonstrations(), dev_demonstrations(task)
    return data.demonstrations(Protocol(task.tools(), cfg.rollout.tool_format), tokenizer), []


def sft_main(cfg: Config, out_dir: str | None = None) -> int:
    """``aepo sft``: train on the task's demonstrations (or the files ``sft.data``), save ``<out>/checkpoints/sft``,
    evaluate."""
    console = get_console()
    data = load_sft_data(cfg)
    task = get_task(cfg)
    check_demonstrations(cfg, task, data)
    out = Path(out_dir or Path(cfg.trainer.run_dir) / f"sft-{datetime.now():%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", to_yaml(cfg))
    model, tokenizer = load_policy(cfg, data.with_texts(task) if data else task)
    demonstrations, dev = sft_demonstrations(cfg, task, data, tokenizer)
    console.print(f"[bold]SFT[/] {task.name}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, "
                  f"{len(tokenizer)} tokens vocabulary, {len(demonstrations)} demonstrations"
                  + (f" from {data.source}" if data else ""))
    metrics = run_sft(cfg, model, tokenizer, demonstrations, dev)
    checkpoint = save_policy(model, tokenizer, out / "checkpoints" / "sft")
    atomic_write_text(out / "sft_metrics.json", json.dumps(metrics, indent=1))
    console.print(f"final loss {metrics['final_loss']:.4f}, {metrics['tokens_per_s']:.0f} tok/s, "
                  f"{metrics['time_s']:.0f} s" + "".join(f", {k} {v:.3f}" for k, v in metrics.items()
                                                          if k.startswith("dev/")))
    console.print(f"checkpoint: {checkpoint}")
    results = evaluate_policy(cfg, model, tokenizer, task)
    atomic_write_text(out / "eval.json", json.dumps({"sft": results}, indent=1))
    print_results(results, title=f"cold-start SFT model on {task.name}/{cfg.eval.split}")
    return 0


def dev_demonstrations(task) -> list[Demonstration]:
    """Held-out teacher demonstrations on the dev split, when the task can write them."""
    demonstrate = getattr(task, "demonstrations_for", None)
    return demonstrate("dev") if demonstrate else []


def evaluate_policy(cfg: Config, model, tokenizer, task) -> dict[str, dict]:
    """pass@1 / pass@k on ``cfg.eval.split`` (G1's evaluator): ``{"<task>/<split>": metrics}``."""
    examples = task.examples(cfg.eval.split)[:cfg.eval.num_questions]
    return evaluate(build_engine(cfg, model, tokenizer), task, examples, cfg, cfg.eval.split)
