"""The tiny model's copy warm-up at several widths: steps, time and copy accuracy afterwards.

For each ``--widths`` value the tiny model is built as ``aepo_rl.models.build_tiny_model`` builds it
(the tokenizer trained on the task's text, ``model.tiny_*`` sizes with ``model.tiny_hidden_size`` set
to the width, the start ``model.tiny_init``, then ``copy_warmup`` for at most ``model.tiny_copy_steps``),
without the cache. Prints, per width, the parameters, the copy accuracy before the first step, the
warm-up's steps and seconds, and the copy accuracy (repeated half, argmax) on ``--batches`` fresh
batches afterwards. Overrides (``model.tiny_head_dim=128``, ``task.name=...``) apply to every width.

    python benchmarks/bench_copy_warmup.py --widths 128,256 [--seed 0] [key=value ...]
"""

from __future__ import annotations

import argparse
import time

import torch

from aepo_rl.config import load_config, parse_overrides
from aepo_rl.models import init_tiny_model, train_tiny_tokenizer
from aepo_rl.models.copy_warmup import (
    CIRCUIT_STEPS,
    COPY_BATCH,
    copy_batch,
    copy_warmup,
    induction_circuit,
    repeated_half_accuracy,
)
from aepo_rl.models.forward import lm_head, packed_hidden
from aepo_rl.tasks import get_task


@torch.no_grad()
def copy_accuracy(model, tokenizer, batches: int, seed: int) -> float:
    """Mean repeated-half accuracy over ``batches`` warm-up batches drawn from a generator the warm-up never uses."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    pool = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    generator = torch.Generator().manual_seed(10_000 + seed)
    scores = []
    for _ in range(batches):
        ids, mask = copy_batch(pool, COPY_BATCH, generator)
        logits = lm_head(model, packed_hidden(model, ids, mask.sum(1))[:, :-1][mask[:, 1:].bool()])
        scores.append(repeated_half_accuracy(logits, ids, mask))
    return sum(scores) / len(scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="128,256", help="comma-separated model.tiny_hidden_size values")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batches", type=int, default=8, help="fresh batches scored after the warm-up")
    parser.add_argument("overrides", nargs="*", help="config overrides applied to every width")
    args = parser.parse_args()
    base = parse_overrides(args.overrides)
    texts = get_task(load_config(overrides=base)).texts()
    tokenizer = None
    for width in map(int, args.widths.split(",")):
        cfg = load_config(overrides={**base, "model.tiny_hidden_size": width})
        m = cfg.model
        tokenizer = tokenizer or train_tiny_tokenizer(texts, m.tiny_vocab_size)
        model = init_tiny_model(m, tokenizer, args.seed)
        circuit = m.tiny_init == "induction"
        if circuit:
            induction_circuit(model, args.seed)
        before = copy_accuracy(model, tokenizer, args.batches, args.seed)
        start = time.perf_counter()
        steps = len(copy_warmup(model, tokenizer, m.tiny_copy_steps, args.seed, CIRCUIT_STEPS if circuit else 0))
        seconds = time.perf_counter() - start
        after = copy_accuracy(model, tokenizer, args.batches, args.seed)
        params = sum(p.numel() for p in model.parameters())
        print(f"width {width} (head_dim {m.tiny_head_dim}, heads {m.tiny_num_heads}/{m.tiny_num_kv_heads}, "
              f"{params / 1e6:.2f}M params, init {m.tiny_init}): copy accuracy {before:.3f} before, "
              f"{after:.3f} after {steps} warm-up steps ({seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
