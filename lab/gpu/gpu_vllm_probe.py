"""vLLM against the HF engine on one GPU, part by part, each under its own time limit (docs/gpu.md).

One random policy of a registered shape (default ``qwen3-0.6b``, bf16, the tiny tokenizer's
vocabulary, as ``aepo train model.init=random:qwen3-0.6b`` builds it) goes through:

a. ``start``: seconds to build ``VLLMEngine`` (``--compilation-config``: by default the fast start,
   no inductor, CUDA graphs of whole decode steps);
b. ``speed``: decode tokens/s of vLLM and of the HF engine (``rollout.cuda_graphs=auto``) on the same
   workload (``--rows`` prompts, ragged budgets up to ``--new-tokens``, two rounds with a tool result
   appended between them, EOS ignored), then ``ratio vllm/hf``; vLLM's prefix-cache hits;
c. ``parity``: greedy tokens of both engines (share of positions that agree before the first
   difference) and |Δ log p| of vLLM's sampled tokens against the trainer's forward
   (``response_logprobs``, as the RL update computes π_old);
d. ``sleep``: free GPU memory before and after ``sleep()`` (level 2), seconds of sleep and of the wake
   with ``sync_weights``;
e. ``sync``: one AdamW step on the policy, ``sync_weights``, then vLLM's log-probs of fixed tokens
   against the updated model's and the old one's.

Each part prints one JSON line (also appended to ``--out``); a part that fails or runs out of time
records its error and the next one runs. On the CPU (``--device cpu``, vLLM's CPU build) it is a dry
run: sleep is a no-op there.

    python3 lab/gpu/gpu_vllm_probe.py --out probe.jsonl           # on the GPU machine
    python3 lab/gpu/gpu_vllm_probe.py --device cpu --shape tiny --dtype float32 --rows 4 --new-tokens 8 --out p.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

FAST_START = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128]}


class PartTimeout(Exception):
    pass


def run_part(name: str, seconds: int, out: Path, fn, *args) -> dict | None:
    """Run one part under an alarm; print and append its JSON line; None when it failed."""
    def expire(*_):
        raise PartTimeout(f"over {seconds} s")

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    start = time.perf_counter()
    try:
        record = {"part": name, **fn(*args)}
    except Exception as error:  # every part reports, none stops the others
        record = {"part": name, "error": f"{type(error).__name__}: {error}"[:300],
                  "where": traceback.format_exc(limit=-1).strip().splitlines()[-2][:200]}
    finally:
        signal.alarm(0)
    record["seconds"] = round(time.perf_counter() - start, 2)
    line = json.dumps(record)
    print(line, flush=True)
    with out.open("a") as f:
        f.write(line + "\n")
    return None if "error" in record else record


def workload(tokenizer, rows: int, new_tokens: int):
    from bench_rollout import random_prompts

    prompts = random_prompts(tokenizer, rows, 64, seed=0)
    draw = random.Random(0)
    budgets = [draw.randint(max(1, new_tokens // 4), new_tokens) for _ in prompts]
    return prompts, budgets, tokenizer.encode(" <result>\n150\n</result>", add_special_tokens=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="qwen3-0.6b", help="a registered architecture, or tiny (the dry run)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--compilation-config", default=json.dumps(FAST_START),
                        help="vLLM's compilation_config as JSON; 'default' for vLLM's own (inductor)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--out", default="vllm_probe.jsonl")
    parser.add_argument("--stand-in", action="store_true",
                        help="the HF engine in place of vLLM (a dry run without vLLM)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_rollout import pseudo_text
    from bench_static_decode import two_rounds

    from aepo_rl.config import ModelConfig
    from aepo_rl.engines.base import SamplingParams
    from aepo_rl.engines.hf import HFEngine
    from aepo_rl.engines.stops import eos_token_ids
    from aepo_rl.engines.vllm import VLLMEngine
    from aepo_rl.models import init_random_model, init_tiny_model, save_policy, torch_dtype, train_tiny_tokenizer
    from aepo_rl.rollout.trajectory import Trajectory
    from aepo_rl.train.rl import collate, response_logprobs

    out = Path(args.out)
    device = torch.device(args.device)
    tokenizer = train_tiny_tokenizer([pseudo_text(20000, seed) for seed in range(3)], ModelConfig().tiny_vocab_size)
    if args.shape == "tiny":  # the dry run on the CPU
        model = init_tiny_model(ModelConfig(), tokenizer, seed=0).to(device, torch_dtype(args.dtype)).eval()
    else:
        model = init_random_model(args.shape, tokenizer, torch_dtype(args.dtype), device)
    folder = Path(tempfile.mkdtemp(prefix="aepo-vllm-probe-"))
    save_policy(model, tokenizer, folder / "model")
    compilation = None if args.compilation_config == "default" else json.loads(args.compilation_config)
    prompts, budgets, tool = workload(tokenizer, args.rows, args.new_tokens)
    state: dict = {}

    def start():
        t = time.perf_counter()
        if args.stand_in:
            state["vllm"] = StandIn(model, tokenizer, seed=0, cuda_graphs="off")
            return {"stand_in": "HFEngine (dynamic path) in place of vLLM: a dry run of this script"}
        state["vllm"] = VLLMEngine(str(folder / "model"), tokenizer, gpu_memory_utilization=args.gpu_memory_utilization,
                                   dtype=args.dtype, seed=0, eos_ids=eos_token_ids(tokenizer, model),
                                   compilation_config=compilation)
        return {"vllm_start_s": round(time.perf_counter() - t, 2), "compilation_config": compilation}

    def speed():
        vllm, hf = state["vllm"], HFEngine(model, tokenizer, seed=0)
        state["hf"] = hf
        two_rounds(vllm, prompts[:4], budgets[:4], tool)  # warm-up
        two_rounds(hf, prompts, budgets, tool)  # warm-up: captures the buckets' graphs
        figures = {name: two_rounds(engine, prompts, budgets, tool) for name, engine in (("vllm", vllm), ("hf", hf))}
        return {"tokens_per_s": {k: round(v) for k, v in figures.items()},
                "ratio_vllm_hf": figures["vllm"] / figures["hf"],
                "hf_graphs": hf.static is not None and hf.static.graphs_captured, "vllm_counters": vllm.stats()}

    def logprob_gap(engine, trajectories_model, n=8, budget=32):
        """vLLM's sampled tokens and log-probs on n prompts, and |Δ log p| against ``trajectories_model``'s forward."""
        seqs = [engine.add_sequence(p) for p in prompts[:n]]
        segments = engine.generate(seqs, SamplingParams(), [budget] * len(seqs))
        return segments, _gap(trajectories_model, prompts[:n], segments)

    def _gap(policy, prompt_ids, segments):
        rows = [(p, s.token_ids, s.logprobs) for p, s in zip(prompt_ids, segments) if s.token_ids]
        batch = collate([_trajectory(p, t) for p, t, _ in rows], list(range(len(rows))), tokenizer.pad_token_id)
        with torch.no_grad():
            logp, _ = response_logprobs(policy, batch.to(device), bf16=False)
        every = torch.cat([(logp[i, :len(t)].float().cpu() - torch.tensor(lp)).abs()
                           for i, (_, t, lp) in enumerate(rows)])
        return {"mean_abs_dlogp": float(every.mean()), "max_abs_dlogp": float(every.max()), "tokens": every.numel()}

    def parity():
        vllm, hf = state["vllm"], state["hf"]
        greedy = SamplingParams(greedy=True)
        n = min(8, len(prompts))
        a = vllm.generate([vllm.add_sequence(p) for p in prompts[:n]], greedy, [32] * n)
        b = hf.generate([hf.add_sequence(p) for p in prompts[:n]], greedy, [32] * n)
        agree = [next((k for k, (x, y) in enumerate(zip(s.token_ids, t.token_ids)) if x != y), len(s.token_ids))
                 / max(1, len(s.token_ids)) for s, t in zip(a, b)]
        _, gap = logprob_gap(vllm, model)
        return {"greedy_prefix_agreement": sum(agree) / len(agree), **gap}

    def sleep():
        vllm = state["vllm"]
        free = lambda: torch.cuda.mem_get_info()[0] / 2**30 if device.type == "cuda" else None  # noqa: E731
        before = free()
        t = time.perf_counter()
        vllm.sleep()
        slept = time.perf_counter() - t
        asleep = free()
        t = time.perf_counter()
        vllm.sync_weights(model)
        return {"free_gib_awake": before, "free_gib_asleep": asleep, "sleep_s": round(slept, 3),
                "wake_and_sync_s": round(time.perf_counter() - t, 3)}

    def sync():
        vllm = state["vllm"]
        old = _snapshot(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model.train()
        ids = torch.tensor([prompts[0] + prompts[1]], device=device)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        model.eval()
        vllm.sync_weights(model)
        segments, new_gap = logprob_gap(vllm, model)
        old_gap = _gap(old, prompts[:len(segments)], segments)
        return {"updated": new_gap, "against_old_weights": old_gap}

    def _snapshot(policy):
        import copy

        return copy.deepcopy(policy).eval()

    def _trajectory(prompt, tokens):
        return Trajectory(prompt_id="probe", traj_id=0, parent_id=None, fork_token_index=None,
                          prompt_token_ids=list(prompt), response_token_ids=list(tokens), loss_mask=[1] * len(tokens),
                          logprobs=[0.0] * len(tokens), entropies=[0.0] * len(tokens), rounds=[])

    limits = {"start": 150, "speed": 150, "parity": 60, "sleep": 60, "sync": 60}
    for name, fn in (("start", start), ("speed", speed), ("parity", parity), ("sleep", sleep), ("sync", sync)):
        run_part(name, limits[name], out, fn if "vllm" in state or name == "start" else not_started)


def not_started() -> dict:
    raise RuntimeError("skipped: vLLM did not start")


class StandIn:
    """``--stand-in``: the HF engine with VLLMEngine's ``sleep``/``sync_weights`` as no-ops (it shares the weights)."""

    def __init__(self, model, tokenizer, **kwargs):
        from aepo_rl.engines.hf import HFEngine

        self.engine = HFEngine(model, tokenizer, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def sleep(self) -> None:
        pass

    def sync_weights(self, model) -> None:
        pass


if __name__ == "__main__":
    main()
