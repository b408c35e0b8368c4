"""The main job's phases with AVX2 kernels against the default ones: ``ratio avx2/default`` per phase and whole.

A machine without AVX-512 runs torch's AVX2 kernels; :data:`AVX2_ENV` (``ATEN_CPU_CAPABILITY=avx2`` and
the same limit for MKL and oneDNN, which run the matrix products) makes an AVX-512 machine run them too.
Each phase of ``aepo train`` (preset ``aepo``, the tiny default model) is timed on a slice, in a fresh
subprocess per measurement, alternating the two capabilities (and which goes first) round by round, so
machine load hits both alike:

    warmup   copy warm-up steps of the tiny-model build (models/copy_warmup.py)
    sft      cold-start SFT optimizer steps (train/sft.py)
    eval     evaluation of the first questions of the eval split, eval.samples each (evaluate.py)
    rl       RL steps (RLTrainer.step), split into generation and update

The SFT, evaluation and RL slices start from one prepared model (the induction-circuit tiny model
after ``--prepare-epochs`` SFT epochs, built once in a temporary cache with the default kernels and
not timed), so their rollouts look like the job's. Per phase the median seconds per unit (step or
question) of each side and their ratio are printed; the last line is the whole job estimated as
Σ phase median per unit × the job's units (the warm-up's ``CIRCUIT_STEPS``, SFT steps, two
evaluations, ``trainer.steps``), with each side's estimate: ``ratio avx2/default whole: …``.
Children run with the job's thread settings (torch's default, ``rollout.cpu_decode_threads``).

    python benchmarks/bench_avx2.py [--rounds 3] [--warmup-steps 30] [--sft-steps 8] [--eval-questions 16]
                                    [--rl-steps 2] [--threads N] [--phases warmup,sft,eval,rl]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("warmup", "sft", "eval", "rl")
CAPABILITIES = ("avx2", "default")
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
"""The AVX2 side's environment: ATen's own kernels (elementwise, reductions, softmax, attention) follow
``ATEN_CPU_CAPABILITY``, but the matrix products go to MKL and oneDNN, which pick their instruction set
themselves (measured: a [4096, 128] × [128, 2048] product as fast with ``ATEN_CPU_CAPABILITY=avx2`` alone as
by default, 1.35× slower with all three)."""


def job_config(cache_dir: str, overrides: list[str] = ()):
    from aepo_rl.config import load_config

    return load_config("aepo", overrides=[f"model.cache_dir={cache_dir}", *overrides])


def prepare(cache_dir: str, epochs: int) -> str:
    """The tiny model (induction circuit, no copy warm-up) after ``epochs`` SFT epochs, saved under ``cache_dir``."""
    from aepo_rl.models import load_policy, save_policy
    from aepo_rl.tasks import get_task
    from aepo_rl.train.sft import run_sft

    cfg = job_config(cache_dir, ["model.tiny_copy_steps=0", f"sft.epochs={epochs}"])
    task = get_task(cfg)
    model, tokenizer = load_policy(cfg, task)
    if epochs:
        run_sft(cfg, model, tokenizer, task.demonstrations())
    out = str(Path(cache_dir) / "prepared")
    save_policy(model, tokenizer, out)
    return out


def child(phase: str, cache_dir: str, model_dir: str, count: int) -> dict:
    """Seconds of ``count`` units of ``phase`` (and its parts), measured in this process."""
    from aepo_rl.engines import build_engine
    from aepo_rl.models import load_policy
    from aepo_rl.tasks import get_task

    cfg = job_config(cache_dir, [f"model.path={model_dir}"])
    task = get_task(cfg)
    model, tokenizer = load_policy(cfg, task)
    if phase == "warmup":
        from aepo_rl.models import init_tiny_model
        from aepo_rl.models.copy_warmup import copy_warmup, induction_circuit

        fresh = init_tiny_model(cfg.model, tokenizer, 0)
        induction_circuit(fresh, 0)
        t0 = time.perf_counter()
        copy_warmup(fresh, tokenizer, count, seed=0, min_steps=count)
        return {"seconds": time.perf_counter() - t0}
    if phase == "sft":
        from aepo_rl.train.sft import run_sft

        cfg.sft.epochs = 1
        demos = task.demonstrations()[:count * cfg.sft.batch_size]
        t0 = time.perf_counter()
        run_sft(cfg, model, tokenizer, demos)
        return {"seconds": time.perf_counter() - t0}
    if phase == "eval":
        from aepo_rl.evaluate import evaluate

        engine = build_engine(cfg, model, tokenizer)
        t0 = time.perf_counter()
        evaluate(engine, task, task.examples(cfg.eval.split)[:count], cfg, cfg.eval.split)
        return {"seconds": time.perf_counter() - t0}
    if phase == "rl":
        from aepo_rl.train.rl import RLTrainer

        trainer = RLTrainer(cfg, model, tokenizer, task, build_engine(cfg, model, tokenizer))
        parts = {"seconds": 0.0, "generation": 0.0, "update": 0.0}
        for _ in range(count):
            metrics = trainer.step()
            parts["seconds"] += metrics["timing_s/step"]
            parts["generation"] += metrics["timing_s/gen"]
            parts["update"] += metrics["timing_s/step"] - metrics["timing_s/gen"]
        return parts
    raise ValueError(f"unknown phase {phase!r}: one of {PHASES}")


def run_child(capability: str, phase: str, cache_dir: str, model_dir: str, count: int, threads: int | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in AVX2_ENV}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if capability == "avx2":
        env.update(AVX2_ENV)
    out = subprocess.run([sys.executable, __file__, "--child", phase, "--cache", cache_dir, "--model-dir", model_dir,
                          "--count", str(count)], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{capability} {phase} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def job_units(cache_dir: str) -> dict[str, int]:
    """How many units of each phase ``aepo train`` runs: warm-up steps (at least), SFT steps, evaluated
    questions (before and after RL), RL steps."""
    from aepo_rl.models.copy_warmup import CIRCUIT_STEPS
    from aepo_rl.tasks import get_task

    cfg = job_config(cache_dir)
    task = get_task(cfg)
    sft_steps = cfg.sft.epochs * math.ceil(len(task.demonstrations()) / cfg.sft.batch_size)
    questions = len(task.examples(cfg.eval.split))
    questions = min(questions, cfg.eval.num_questions or questions)
    return {"warmup": CIRCUIT_STEPS, "sft": sft_steps, "eval": 2 * questions, "rl": cfg.trainer.steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-steps", type=int, default=30)
    parser.add_argument("--sft-steps", type=int, default=8)
    parser.add_argument("--eval-questions", type=int, default=16)
    parser.add_argument("--rl-steps", type=int, default=2)
    parser.add_argument("--prepare-epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of the children (default: as set here, the job's "
                        "setting); 1 on a machine shared with other jobs, where waiting for a second thread swamps "
                        "the kernels")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset of " + ",".join(PHASES))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cache, args.model_dir, args.count)))
        return
    counts = {"warmup": args.warmup_steps, "sft": args.sft_steps, "eval": args.eval_questions, "rl": args.rl_steps}
    phases = [p for p in args.phases.split(",") if p]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_avx2-") as cache_dir:
        model_dir = prepare(cache_dir, args.prepare_epochs)
        units = job_units(cache_dir)
        print(f"slices: {', '.join(f'{p} {counts[p]}' for p in phases)}; rounds {args.rounds}; "
              f"OMP_NUM_THREADS={args.threads or os.environ.get('OMP_NUM_THREADS', 'unset')}; job units {units}")
        times: dict[tuple[str, str], list[dict]] = {(c, p): [] for c in CAPABILITIES for p in phases}
        for round_index in range(args.rounds):
            order = CAPABILITIES if round_index % 2 == 0 else CAPABILITIES[::-1]
            for phase in phases:
                for capability in order:
                    times[capability, phase].append(run_child(capability, phase, cache_dir, model_dir, counts[phase],
                                                              args.threads))
                a, d = times["avx2", phase][-1]["seconds"], times["default", phase][-1]["seconds"]
                print(f"round {round_index + 1} {phase:6s}: avx2 {a:7.2f} s | default {d:7.2f} s | ratio {a / d:.2f}")
    whole = dict.fromkeys(CAPABILITIES, 0.0)
    for phase in phases:
        median = {c: statistics.median(t["seconds"] for t in times[c, phase]) / counts[phase] for c in CAPABILITIES}
        extra = ""
        if phase == "rl":
            parts = {part: {c: statistics.median(t[part] for t in times[c, phase]) for c in CAPABILITIES}
                     for part in ("generation", "update")}
            extra = "".join(f", {part} {v['avx2'] / v['default']:.2f}" for part, v in parts.items())
        for c in CAPABILITIES:
            whole[c] += median[c] * units[phase]
        print(f"{phase:6s} per unit: avx2 {median['avx2']:.3f} s, default {median['default']:.3f} s; "
              f"ratio avx2/default {phase}: {median['avx2'] / median['default']:.2f}{extra}")
    print(f"job estimate (Σ per unit × job units): avx2 {whole['avx2']:.0f} s, default {whole['default']:.0f} s")
    print(f"ratio avx2/default whole: {whole['avx2'] / whole['default']:.2f}")


if __name__ == "__main__":
    main()
