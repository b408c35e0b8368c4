"""The same tree rollout through HFEngine and VLLMEngine, side by side in one run (docs/engines.md).

One policy (``--model DIR``, e.g. a run's SFT checkpoint, so that trajectories call tools and
branch; default: the tiny default model without its copy warm-up, i.e. random weights), the synthetic task's first
``--prompts`` training questions, the default AEPO rollout settings with ``entropy_measure=surprisal``
(a measure both engines give) and a fixed seed. The engines take turns for ``--repeats`` rounds;
each round is timed whole. Prints, per engine, generated tokens per second (median), prefill
tokens per rollout (uncached context tokens the engine computed) and generated tokens, then
``ratio vllm/hf: <tok/s of vLLM ÷ tok/s of HF>``. Needs vLLM: run it with the interpreter of the venv
``.ci/run`` builds,

    OMP_NUM_THREADS=2 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 \\
        .venv-vllm/bin/python benchmarks/bench_engines.py [--model runs/X/checkpoints/sft --prompts 8 --repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from aepo_rl.config import load_config
from aepo_rl.engines import build_engine
from aepo_rl.models import encode_prompt, load_policy
from aepo_rl.rollout.tree import run_rollout
from aepo_rl.tasks import get_task


def rollout_once(engine, prompts, tools, rollout_cfg, seed: int) -> tuple[float, int, int]:
    """(seconds, prefill tokens, generated tokens) of one tree rollout on ``engine``."""
    before = engine.stats()
    start = time.perf_counter()
    result = run_rollout(engine, prompts, tools, rollout_cfg, seed=seed)
    seconds = time.perf_counter() - start
    after = engine.stats()
    generated = sum(sum(t.loss_mask) for group in result.groups for t in group)
    return seconds, int(after["prefill_tokens"] - before["prefill_tokens"]), generated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF folder of the policy; default a random tiny Qwen3")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    overrides = {"rollout.entropy_measure": "surprisal"}
    overrides.update({"model.path": args.model} if args.model else {"model.tiny_copy_steps": 0})  # random weights
    cfg = load_config(overrides=overrides)
    task = get_task(cfg)
    model, tokenizer = load_policy(cfg, task)
    prompts = [(ex.id, encode_prompt(tokenizer, ex.messages)) for ex in task.examples("train")[:args.prompts]]
    tools = task.tools()
    engines = {"hf": build_engine(cfg, model, tokenizer),
               "vllm": build_engine(load_config(overrides={**overrides, "rollout.engine": "vllm"}), model, tokenizer)}
    for engine in engines.values():  # warm-up: first-call costs (vLLM's graph capture, caches) are not timed
        rollout_once(engine, prompts[:1], tools, cfg.rollout, seed=0)
    runs = {name: [] for name in engines}
    for r in range(args.repeats):
        for name, engine in engines.items():
            runs[name].append(rollout_once(engine, prompts, tools, cfg.rollout, seed=r + 1))
    print(f"tree rollout: {len(prompts)} prompts, n = {cfg.rollout.n}, {cfg.rollout.mode} mode, "
          f"policy {args.model or 'random tiny Qwen3'}, {args.repeats} rounds each, engines in turn")
    rates = {}
    for name, rows in runs.items():
        rates[name] = statistics.median(generated / seconds for seconds, _, generated in rows)
        prefill = statistics.median(p for _, p, _ in rows)
        generated = statistics.median(g for _, _, g in rows)
        print(f"  {name:<5} {rates[name]:8.0f} generated tok/s   prefill {prefill:7.0f} tokens   "
              f"generated {generated:6.0f} tokens (medians)")
    print(f"ratio vllm/hf: {rates['vllm'] / rates['hf']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
