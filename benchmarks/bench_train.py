"""Training throughput of the RL update step vs a bare forward+backward+AdamW loop (target: ratio ≥ 0.8).

Both sides train the same tiny default model (``model.tiny_*``) on the same rollout batch:
``trainer.batch_size`` prompts × ``rollout.n`` trajectories with ~PROMPT_LEN prompt tokens and
~RESPONSE_LEN response tokens, a quarter of them tool-result tokens (loss mask 0). The RL side is
``RLTrainer.update`` (old log-probs pass, advantages, the preset's loss over mini/micro-batches, AdamW with
clipping); the bare side runs masked cross-entropy over the same micro-batches with one AdamW step
per mini-batch. Prints tokens/s of each, side by side, and finally ``ratio train/bare: <value>``.
The RL side must compute log π_old before the update for every mini-batch but the first (the
first is on-policy: its training forward gives π_old). The ``aepo`` preset's mini-batch entropy
statistics (§2.2) use the entropies the engine recorded during the rollout, as with the HF engine,
which shares the model (a stand-in engine here), so they cost no extra pass.

With ``--correction`` it also times, interleaved on the same batch, the update with Rollout Correction
(§2.11) on: decoupled token IS, decoupled sequence IS + token_k1 rejection, and bypass mode, each as a
ratio to the update with it off, paired within each round (the rollout log-probs are then the base
model's own, plus N(0, 0.05²) noise, as a sampler that disagrees slightly with the trainer); and the work
the update does for the correction even when it is off (the mismatch metrics, the k3 KL of each
mini-batch, the finiteness check), timed alone on the whole batch, as a share of the off update.

    python benchmarks/bench_train.py [--repeats 5] [--preset aepo] [--correction]
                                     [dotted overrides, e.g. trainer.bf16=true]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from aepo_rl.algorithms.rollout_correction import mismatch_metrics, to_floats
from aepo_rl.algorithms.tensors import masked_mean
from aepo_rl.config import load_config
from aepo_rl.models import tiny_config
from aepo_rl.rollout.trajectory import Round, Trajectory
from aepo_rl.tasks.base import Example
from aepo_rl.train.rl import RLTrainer, ScoredGroup, batched_logprobs, by_length, collate

PROMPT_LEN, RESPONSE_LEN = 96, 192
CORRECTIONS = {
    "token IS": {"algorithm.rollout_correction.rollout_is": "token"},
    "seq IS + token_k1 RS": {"algorithm.rollout_correction.rollout_is": "sequence",
                             "algorithm.rollout_correction.rollout_is_threshold": "0.5_2.0",
                             "algorithm.rollout_correction.rollout_rs": "token_k1",
                             "algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0"},
    "bypass + token_k1 RS": {"algorithm.rollout_correction.bypass_mode": True,
                             "algorithm.rollout_correction.rollout_rs": "token_k1",
                             "algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0"},
}
"""The ``--correction`` variants, each timed against the update with Rollout Correction off."""


class _NoTask:
    """The update step needs no task: one placeholder example, no tools."""

    name = "bench"

    def examples(self, split):
        return [Example(id="q", question="q", answers=["a"], data_source="bench", messages=[])]

    def tools(self):
        return {}


def rollout_batch(cfg, vocab_size: int, seed: int = 0) -> list[ScoredGroup]:
    g = torch.Generator().manual_seed(seed)
    groups = []
    for prompt_index in range(cfg.trainer.batch_size):
        prompt = torch.randint(0, vocab_size, (PROMPT_LEN,), generator=g).tolist()
        trajectories = []
        for traj_id in range(cfg.rollout.n):
            length = int(torch.randint(RESPONSE_LEN // 2, RESPONSE_LEN + 1, (1,), generator=g))
            response = torch.randint(0, vocab_size, (length,), generator=g).tolist()
            tool_start, tool_end = length // 3, length // 3 + length // 4
            mask = [0 if tool_start <= i < tool_end else 1 for i in range(length)]
            trajectories.append(Trajectory(
                prompt_id=f"p{prompt_index}", traj_id=traj_id, parent_id=None, fork_token_index=None,
                prompt_token_ids=prompt, response_token_ids=response, loss_mask=mask,
                logprobs=[0.0] * length, entropies=[0.0] * length,
                rounds=[Round(0, tool_start, 0.0), Round(tool_end, length, 0.0)]))
        scores = torch.rand(cfg.rollout.n, generator=g).tolist()
        groups.append(ScoredGroup(_NoTask().examples("train")[0], trajectories, scores))
    return groups


def record_behaviour_log_probs(model, groups, batch, cfg) -> None:
    """Give every trajectory the base model's log-probs of its tokens plus N(0, 0.05²) noise, as its engine's record."""
    log_probs, _ = batched_logprobs(model, batch, torch.arange(batch.num_rows), cfg.trainer.micro_batch_size,
                                    cfg.trainer.bf16, with_entropy=False)
    noisy = log_probs + 0.05 * torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(1))
    trajectories = [t for g in groups for t in g.trajectories]
    for row, traj in enumerate(trajectories):
        traj.logprobs = noisy[row, :len(traj.response_token_ids)].tolist()


def off_path_seconds(batch, repeats: int = 20) -> float:
    """Seconds of what the update computes for the correction when it is off, on the whole batch: the finiteness
    check and ``rollout_corr/*`` metrics of the step, and the k3 KL (``actor/approx_kl``) of its tokens."""
    old = batch.rollout_log_probs + 0.01
    mask = batch.response_mask.bool()
    t0 = time.perf_counter()
    for _ in range(repeats):
        bool(torch.isfinite(batch.rollout_log_probs).all())
        to_floats(mismatch_metrics(old, batch.rollout_log_probs, batch.response_mask))
        log_ratio = (batch.rollout_log_probs - old).clamp(-20, 20)
        float(masked_mean(log_ratio.exp() - 1 - log_ratio, mask))
    return (time.perf_counter() - t0) / repeats


def bare_update(model, optimizer, batch, cfg) -> None:
    """Masked next-token cross-entropy over the same (length-sorted) micro-batches, one AdamW step per mini-batch."""
    rows_per_mini = cfg.trainer.mini_batch_size * cfg.rollout.n
    model.train()
    for mini in torch.split(torch.arange(batch.num_rows), rows_per_mini):
        optimizer.zero_grad(set_to_none=True)
        tokens = batch.response_mask[mini].sum()
        for micro in torch.split(by_length(batch, mini), cfg.trainer.micro_batch_size):
            sub = batch.rows(micro)
            labels = torch.full_like(sub.input_ids, -100)
            for i in range(len(micro)):
                p = int(sub.prompt_lengths[i])
                n = int(sub.sequence_lengths[i]) - p
                labels[i, p:p + n] = torch.where(sub.response_mask[i, :n] > 0, sub.responses[i, :n], -100)
            logits = model(input_ids=sub.input_ids, use_cache=False).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     labels[:, 1:].reshape(-1), reduction="sum") / tokens
            loss.backward()
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--preset", default="aepo")
    parser.add_argument("--correction", action="store_true", help="also time Rollout Correction's modes against off")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_config(args.preset, overrides=args.overrides)
    from transformers import AutoModelForCausalLM

    m = cfg.model
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(tiny_config(m, m.tiny_vocab_size, eos_token_id=1, pad_token_id=0),
                                            dtype=torch.float32)
    tokenizer = type("Tok", (), {"pad_token_id": 0})()
    groups = rollout_batch(cfg, m.tiny_vocab_size)
    batch = collate([t for g in groups for t in g.trajectories],
                    [i for i, g in enumerate(groups) for _ in g.trajectories], pad_token_id=0)
    tokens = int(batch.sequence_lengths.sum())
    print(f"preset {cfg.preset}, model {sum(p.numel() for p in base.parameters()) / 1e6:.2f}M params, "
          f"{batch.num_rows} sequences, "
          f"{tokens} tokens ({int(batch.response_mask.sum())} trained), mini-batch {cfg.trainer.mini_batch_size} "
          f"prompts, micro-batch {cfg.trainer.micro_batch_size} sequences, bf16 {cfg.trainer.bf16}, "
          f"{torch.get_num_threads()} threads")

    ours_model, bare_model = copy.deepcopy(base), copy.deepcopy(base)
    engine = type("SharedModelEngine", (), {"model": ours_model})()  # like HFEngine: shares the policy's model
    trainer = RLTrainer(cfg, ours_model, tokenizer, _NoTask(), engine=engine)
    variants = {}
    if args.correction:
        record_behaviour_log_probs(base, groups, batch, cfg)
        for name, overrides in CORRECTIONS.items():
            variant_cfg = load_config(args.preset,
                                      overrides=args.overrides + [f"{k}={v}" for k, v in overrides.items()])
            model = copy.deepcopy(base)
            variants[name] = RLTrainer(variant_cfg, model, tokenizer, _NoTask(),
                                       engine=type("SharedModelEngine", (), {"model": model})())
    paired_ratio: dict[str, list[float]] = {name: [] for name in variants}
    bare_optimizer = torch.optim.AdamW(bare_model.parameters(), lr=cfg.trainer.lr,
                                       weight_decay=cfg.trainer.weight_decay)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.trainer.bf16)
    ours, bare, off_seconds = [], [], []
    for repeat in range(args.repeats + 1):  # the first round warms up both sides
        t0 = time.perf_counter()
        trainer.update(groups)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        with autocast:
            bare_update(bare_model, bare_optimizer, batch, cfg)
        t_bare = time.perf_counter() - t0
        seconds = {}
        for name, variant in variants.items():
            t0 = time.perf_counter()
            variant.update(groups)
            seconds[name] = time.perf_counter() - t0
        if repeat:
            off_seconds.append(t_ours)
            ours.append(tokens / t_ours)
            bare.append(tokens / t_bare)
            for name, t in seconds.items():
                paired_ratio[name].append(t_ours / t)  # paired: this round's off update against the variant
            extra = "".join(f" | {name} {tokens / seconds[name]:8.0f}" for name in variants)
            print(f"round {repeat}: RL update {ours[-1]:8.0f} tok/s | bare loop {bare[-1]:8.0f} tok/s{extra}")
    ours_tps, bare_tps = statistics.median(ours), statistics.median(bare)
    print(f"median: RL update {ours_tps:.0f} tok/s, bare forward+backward+AdamW {bare_tps:.0f} tok/s")
    print(f"ratio train/bare: {ours_tps / bare_tps:.3f}")
    for name in variants:  # < 1: the correction's update is slower than the update with it off
        print(f"ratio {name}/off (tok/s, median of paired rounds): {statistics.median(paired_ratio[name]):.3f}")
    if args.correction:
        extra = off_path_seconds(batch)
        print(f"correction-off work per update: {extra * 1e3:.2f} ms = "
              f"{100 * extra / statistics.median(off_seconds):.2f}% of the off update")


if __name__ == "__main__":
    main()
