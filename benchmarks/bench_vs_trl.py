"""Time of our RL step against TRL's ``GRPOTrainer`` step on the same tiny model and workload (target: ratio ≤ 0.8).

Both sides start from one randomly initialised tiny model (``model.tiny_*``, a BPE tokenizer of
``model.tiny_vocab_size`` trained on seeded pseudo-words) and train it on the same workload, in one
process with the same torch thread count: ``trainer.batch_size`` chat prompts (the whole prompt set,
so every step of either side sees the same prompts), ``rollout.n`` completions per prompt of exactly
``rollout.max_response_length`` tokens, micro-batches of ``trainer.micro_batch_size`` sequences and one
AdamW step per RL step. Single turn, no tools: our side runs ``RLTrainer.step`` in
``rollout.mode=independent`` (the ``grpo`` preset by default; ``--preset aepo`` adds AEPO's loss) on the
HF engine with ``rollout.min_tokens`` = the length and ``rollout.ignore_eos``; TRL's side runs its own
training loop with ``generation_kwargs={"min_new_tokens": length}``, ``loss_type="dapo"`` (token mean
over the batch, as ours), ``beta=0``, no gradient checkpointing, plain ``adamw_torch``, constant lr.
Both score completions with the same trivial reward (the share of distinct characters).

The steps alternate after one warm-up step each: a TRL callback runs our step at the end of every TRL
optimizer step, so a TRL step is the time between two of our steps (its whole loop: batch, generation,
scoring, forward/backward per micro-batch, clipping, optimizer, bookkeeping). The generated tokens of
every step are counted on both sides (prompt tokens too) and must be equal, and equal to prompts × n ×
length. Per round it prints each side's step time split into generation (ours: ``timing_s/gen``; TRL:
``_generate_and_score_completions``, both with scoring) and update (ours: ``timing_s/old_log_prob`` +
``timing_s/update``; TRL: the rest of its step); then the medians and finally
``ratio ours/trl: <median of the per-round step-time ratios>``.

    python benchmarks/bench_vs_trl.py [--repeats 5] [--preset grpo] [--threads N] [dotted overrides, e.g. rollout.n=4]

Needs TRL (``pip install trl``; written against 1.16).
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch

from aepo_rl.config import Config, load_config
from aepo_rl.engines import build_engine
from aepo_rl.models import init_tiny_model, train_tiny_tokenizer
from aepo_rl.tasks.base import Example
from aepo_rl.train.rl import RLTrainer

WORKLOAD = {"trainer.batch_size": 4, "rollout.n": 8, "rollout.max_response_length": 64,
            "trainer.micro_batch_size": 16}
"""The benchmark's defaults (the command line's overrides come after): 4 prompts × 8 completions × 64 tokens."""
PROMPT_WORDS = 24


class TokenCountMismatch(AssertionError):
    """The two sides did not process the same number of tokens in a step: their times are not comparable."""


@dataclass
class StepTime:
    """One step of one side: seconds in all, in generation (with scoring) and in the update, and its token counts."""

    total: float
    gen: float
    update: float
    completion_tokens: int
    prompt_tokens: int


def distinct_share(text: str) -> float:
    """The trivial reward of both sides: the share of distinct characters in the completion."""
    return len(set(text)) / max(1, len(text))


def trl_reward(completions, **columns) -> list[float]:
    """``distinct_share`` in TRL's calling convention (conversational completions are message lists)."""
    return [distinct_share(c[-1]["content"] if isinstance(c, list) else c) for c in completions]


def pseudo_words(count: int, rng: random.Random) -> str:
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    return " ".join("".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(count))


def build_model(cfg: Config):
    """The tiny tokenizer (trained on seeded pseudo-words) and the randomly initialised tiny model of ``cfg.model``."""
    rng = random.Random(0)
    tokenizer = train_tiny_tokenizer([pseudo_words(5000, rng) for _ in range(4)], cfg.model.tiny_vocab_size)
    return init_tiny_model(cfg.model, tokenizer, seed=cfg.trainer.seed), tokenizer


def questions(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [pseudo_words(PROMPT_WORDS, rng) for _ in range(count)]


def bench_config(preset: str, overrides: list[str]) -> Config:
    """The preset with the workload and the user's overrides, then what a fair comparison fixes: single turn,
    independent completions of exactly ``rollout.max_response_length`` tokens, one optimizer step per RL step."""
    workload = [f"{k}={v}" for k, v in WORKLOAD.items()] + list(overrides)
    cfg = load_config(preset, overrides=["trainer.mini_batch_size=1", *workload])  # reads the batch and the length
    length = cfg.rollout.max_response_length
    fixed = {"rollout.mode": "independent", "rollout.max_tokens_per_round": length, "rollout.min_tokens": length,
             "rollout.ignore_eos": True, "trainer.mini_batch_size": cfg.trainer.batch_size}
    cfg = load_config(preset, overrides=workload + [f"{k}={v}" for k, v in fixed.items()])
    rows = cfg.trainer.batch_size * cfg.rollout.n
    if rows % cfg.trainer.micro_batch_size:
        raise SystemExit(f"trainer.micro_batch_size={cfg.trainer.micro_batch_size} must divide trainer.batch_size × "
                         f"rollout.n = {rows} (TRL accumulates whole micro-batches)")
    if cfg.trainer.ppo_epochs != 1 or cfg.algorithm.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        raise SystemExit("the comparison runs one PPO epoch without a KL term (TRL: num_iterations=1, beta=0)")
    return cfg


class _BenchTask:
    """The prompts as chat messages, no tools, the trivial reward."""

    name = "bench"

    def __init__(self, texts: list[str]):
        self._examples = [Example(id=f"q{i}", question=q, answers=[""], data_source="bench",
                                  messages=[{"role": "user", "content": q}]) for i, q in enumerate(texts)]

    def examples(self, split):
        return self._examples

    def tools(self):
        return {}

    def reward(self, example, response_text: str) -> float:
        return distinct_share(response_text)


def build_ours(cfg: Config, model, tokenizer, texts: list[str]) -> RLTrainer:
    """Our RL trainer over ``model`` with the HF engine sharing it; its ``generate`` records the step's token counts."""
    trainer = RLTrainer(cfg, model, tokenizer, _BenchTask(texts), engine=build_engine(cfg, model, tokenizer))
    generate = trainer.generate

    def counting_generate():
        groups, metrics = generate()
        trajectories = [t for g in groups for t in g.trajectories]
        trainer.bench_counts = (sum(len(t.response_token_ids) for t in trajectories),
                                sum(len(t.prompt_token_ids) for t in trajectories))
        return groups, metrics

    trainer.generate = counting_generate
    return trainer


def ours_step(trainer: RLTrainer) -> StepTime:
    """One ``RLTrainer.step``, timed, with the split its metrics log."""
    t0 = time.perf_counter()
    metrics = trainer.step()
    total = time.perf_counter() - t0
    completion_tokens, prompt_tokens = trainer.bench_counts
    return StepTime(total, metrics["timing_s/gen"], metrics["timing_s/old_log_prob"] + metrics["timing_s/update"],
                    completion_tokens, prompt_tokens)


def build_trl(cfg: Config, model, tokenizer, texts: list[str], steps: int, after_step, output_dir: str):
    """TRL's ``GRPOTrainer`` on the same workload for ``steps`` optimizer steps; ``after_step(StepTime)`` is called
    at the end of each of them (where the benchmark runs our step)."""
    import datasets
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    rows, length = cfg.trainer.batch_size * cfg.rollout.n, cfg.rollout.max_response_length
    accumulation = rows // cfg.trainer.micro_batch_size
    args = GRPOConfig(
        output_dir=output_dir, use_cpu=True, seed=cfg.trainer.seed, max_steps=steps,
        per_device_train_batch_size=cfg.trainer.micro_batch_size, gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation, num_generations=cfg.rollout.n, num_iterations=1,
        max_completion_length=length, generation_kwargs={"min_new_tokens": length},
        temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
        repetition_penalty=cfg.rollout.repetition_penalty, min_p=cfg.rollout.min_p or None,
        learning_rate=cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay, max_grad_norm=cfg.trainer.grad_clip,
        lr_scheduler_type="constant", optim="adamw_torch", bf16=cfg.trainer.bf16, activation_checkpointing=False,
        beta=0.0, loss_type="dapo", epsilon=cfg.algorithm.clip_ratio_low, epsilon_high=cfg.algorithm.clip_ratio_high,
        report_to="none", logging_strategy="no", save_strategy="no", disable_tqdm=True)
    dataset = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in texts])
    generation = {"seconds": 0.0, "completion_tokens": 0, "prompt_tokens": 0}

    class Alternate(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.mark = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            total = time.perf_counter() - self.mark
            after_step(StepTime(total, generation["seconds"], total - generation["seconds"],
                                generation["completion_tokens"], generation["prompt_tokens"]))
            generation.update(seconds=0.0, completion_tokens=0, prompt_tokens=0)
            self.mark = time.perf_counter()

    trainer = GRPOTrainer(model=model, reward_funcs=[trl_reward], args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Alternate()])
    trainer.remove_callback(PrinterCallback)  # its end-of-training summary would interleave with the report
    generate_and_score = trainer._generate_and_score_completions

    def timed_generate_and_score(inputs):
        t0 = time.perf_counter()
        out = generate_and_score(inputs)
        generation["seconds"] += time.perf_counter() - t0
        generation["completion_tokens"] += int(out["completion_mask"].sum())
        generation["prompt_tokens"] += int(out["prompt_mask"].sum())
        return out

    trainer._generate_and_score_completions = timed_generate_and_score
    return trainer


def check_tokens(ours: StepTime, trl: StepTime, expected: int) -> None:
    """Both sides generated ``expected`` tokens and read the same prompt tokens, or :class:`TokenCountMismatch`."""
    if not ours.completion_tokens == trl.completion_tokens == expected or ours.prompt_tokens != trl.prompt_tokens:
        raise TokenCountMismatch(f"generated tokens ours {ours.completion_tokens}, TRL {trl.completion_tokens} "
                                 f"(expected {expected}); prompt tokens ours {ours.prompt_tokens}, TRL "
                                 f"{trl.prompt_tokens}: the two steps did not do the same work")


def run_rounds(cfg: Config, model, tokenizer, texts: list[str], rounds: int, report=None,
               trl_cfg: Config | None = None) -> list[tuple[StepTime, StepTime]]:
    """``rounds`` alternating (TRL step, our step) pairs from copies of ``model``; every pair's token counts checked.
    ``trl_cfg`` (tests only) gives TRL's side another config."""
    ours_trainer = build_ours(cfg, copy.deepcopy(model), tokenizer, texts)
    expected = cfg.trainer.batch_size * cfg.rollout.n * cfg.rollout.max_response_length
    pairs = []

    def after_trl_step(trl: StepTime) -> None:
        ours = ours_step(ours_trainer)
        check_tokens(ours, trl, expected)
        pairs.append((ours, trl))
        if report:
            report(len(pairs), ours, trl)

    with tempfile.TemporaryDirectory() as output_dir:
        trl_trainer = build_trl(trl_cfg or cfg, copy.deepcopy(model), tokenizer, texts, rounds, after_trl_step,
                                output_dir)
        trl_trainer.train()
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--preset", default="grpo")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = bench_config(args.preset, args.overrides)
    import transformers
    import trl

    model, tokenizer = build_model(cfg)
    texts = questions(cfg.trainer.batch_size)
    r = cfg.rollout
    print(f"preset {cfg.preset} (policy loss {cfg.algorithm.policy_loss}), model "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, vocab {len(tokenizer)}, "
          f"{cfg.trainer.batch_size} prompts x {r.n} completions x {r.max_response_length} tokens, micro-batch "
          f"{cfg.trainer.micro_batch_size}, bf16 {cfg.trainer.bf16}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}, trl {trl.__version__}, {torch.get_num_threads()} threads")

    def report(index: int, ours: StepTime, trl_step: StepTime) -> None:
        name = "warm-up" if index == 1 else f"round {index - 1}"
        print(f"{name}: ours {ours.total:6.2f} s (gen {ours.gen:5.2f}, update {ours.update:5.2f}) | "
              f"trl {trl_step.total:6.2f} s (gen {trl_step.gen:5.2f}, update {trl_step.update:5.2f}) | "
              f"generated tokens {ours.completion_tokens} = {trl_step.completion_tokens}, "
              f"{torch.get_num_threads()} threads")

    pairs = run_rounds(cfg, model, tokenizer, texts, args.repeats + 1, report)[1:]  # the first pair warms up

    def median(side: int, part: str) -> float:
        return statistics.median(getattr(pair[side], part) for pair in pairs)

    def ratio(part: str) -> float:
        return statistics.median(getattr(ours, part) / getattr(trl_step, part) for ours, trl_step in pairs)

    print(f"median of {len(pairs)}: ours {median(0, 'total'):.2f} s (gen {median(0, 'gen'):.2f}, update "
          f"{median(0, 'update'):.2f}) | trl {median(1, 'total'):.2f} s (gen {median(1, 'gen'):.2f}, update "
          f"{median(1, 'update'):.2f})")
    print(f"ratio ours/trl generation: {ratio('gen'):.3f}, update: {ratio('update'):.3f}")
    print(f"ratio ours/trl: {ratio('total'):.3f}")


if __name__ == "__main__":
    main()
