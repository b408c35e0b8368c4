"""Evaluation cost at K samples per question and ``eval.batch_size``, side by side in one run.

``aepo compare`` evaluates every run's final policy with ``eval.samples`` (K) independent samples per
question. The HF engine runs a question's prompt once for its K samples, so the cost grows with the
decoded samples, less than K-fold. This evaluates the same questions with one model and engine at each
setting (``K/batch``: K samples, ``eval.batch_size`` questions per rollout call), in alternating
rounds, and prints each setting's best wall time and best CPU time of this process (``time.process_time``:
on a machine other jobs share, the wall time mostly measures them) and their ratios to the first setting.
Run it with ``OMP_NUM_THREADS=1`` so that CPU time is the work done.

    python benchmarks/bench_eval_samples.py --model runs/my-run/checkpoints/sft [--questions 64 --rounds 2
        --settings 4/16,8/16,8/32,8/64] [overrides, e.g. task.max_hops=2]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported, as aepo_rl.cli does

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import time  # noqa: E402

from aepo_rl.config import load_config  # noqa: E402
from aepo_rl.engines import build_engine  # noqa: E402
from aepo_rl.evaluate import evaluate  # noqa: E402
from aepo_rl.tasks import get_task  # noqa: E402
from aepo_rl.train.pipeline import _load_policy_from  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder (e.g. an SFT checkpoint of the task)")
    parser.add_argument("--questions", type=int, default=64, help="test questions evaluated per setting")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds over the settings")
    parser.add_argument("--settings", default="4/16,8/16,8/32,8/64", help="K/eval.batch_size pairs")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()
    cfg = load_config(overrides=args.overrides)
    task = get_task(cfg)
    model, tokenizer = _load_policy_from(cfg, args.model, task)
    engine = build_engine(cfg, model, tokenizer)
    examples = task.examples(cfg.eval.split)[:args.questions]
    settings = [tuple(int(x) for x in item.split("/")) for item in args.settings.split(",")]
    times: dict[tuple[int, int], list[tuple[float, float]]] = {s: [] for s in settings}
    for round_ in range(args.rounds):
        for k, batch in settings:
            run_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, samples=k, batch_size=batch))
            wall, cpu = time.perf_counter(), time.process_time()
            m = evaluate(engine, task, examples, run_cfg, cfg.eval.split)[f"{task.name}/{cfg.eval.split}"]
            times[(k, batch)].append((time.perf_counter() - wall, time.process_time() - cpu))
            print(f"round {round_} K={k} eval.batch_size={batch}: wall {times[(k, batch)][-1][0]:.1f} s, CPU "
                  f"{times[(k, batch)][-1][1]:.1f} s (pass@1 {m['pass@1']:.3f}, {m['response_length/mean']:.1f} tokens "
                  "per answer)", flush=True)
    first = [min(t[i] for t in times[settings[0]]) for i in (0, 1)]
    for (k, batch), values in times.items():
        best = [min(t[i] for t in values) for i in (0, 1)]
        print(f"K={k} eval.batch_size={batch}: best wall {best[0]:.1f} s, CPU {best[1]:.1f} s; ratio to "
              f"{settings[0][0]}/{settings[0][1]}: wall {best[0] / first[0]:.2f}, CPU {best[1] / first[1]:.2f}")


if __name__ == "__main__":
    main()
