"""The training forward pass (``aepo_rl/models/forward.py``): a shared prefix run once, and packed rows.

Forward + backward + AdamW on the tiny default model (``model.tiny_*``), both ways side by side
in one run, in alternating rounds:

(a) an SFT-shaped batch: ``--rows`` sequences that share a ``--prefix``-token system message, each
    continuing for a random 40–90 tokens, right-padded; ``decoder_hidden`` with the prefix run
    once against the whole padded batch (``share_prefix=False``);
(b) a copy warm-up batch (``copy_batch``, the warm-up's own batch size): ``packed_hidden`` against
    the padded batch.

The loss is the next-token cross-entropy over the real targets in both. Prints ms per step of
each and ``ratio shared/full`` and ``ratio packed/padded`` (medians).

    python benchmarks/bench_forward.py [--rows 32 --prefix 55 --repeats 15]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

from aepo_rl.config import load_config
from aepo_rl.models.copy_warmup import COPY_BATCH, copy_batch
from aepo_rl.models.forward import decoder_hidden, lm_head, packed_hidden
from aepo_rl.models.tiny import tiny_config


def tiny_model(cfg):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = tiny_config(cfg.model, cfg.model.tiny_vocab_size, eos_token_id=1, pad_token_id=0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()


def sft_batch(rows: int, prefix: int, vocab: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = prefix + torch.randint(40, 91, (rows,), generator=generator)
    ids = torch.randint(2, vocab, (rows, int(lengths.max())), generator=generator)
    ids[:, :prefix] = ids[0, :prefix]
    real = torch.arange(ids.shape[1]) < lengths[:, None]
    return ids.masked_fill(~real, 0), real


def train_step(model, optimizer, ids: torch.Tensor, real: torch.Tensor, hidden_fn) -> None:
    targets = real[:, 1:]
    logits = lm_head(model, hidden_fn(model, ids)[:, :-1][targets])
    loss = F.cross_entropy(logits, ids[:, 1:][targets])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prefix", type=int, default=55)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    cfg = load_config("aepo")
    base = tiny_model(cfg)
    vocab = cfg.model.tiny_vocab_size
    models = {name: copy.deepcopy(base) for name in ("shared", "full", "packed", "padded")}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in models.items()}
    sides = {
        "shared": lambda m, ids: decoder_hidden(m, ids),
        "full": lambda m, ids: decoder_hidden(m, ids, share_prefix=False),
        "packed": lambda m, ids: packed_hidden(m, ids, (ids != 0).sum(1)),
        "padded": lambda m, ids: decoder_hidden(m, ids, share_prefix=False),
    }
    generator = torch.Generator().manual_seed(0)
    pool = torch.arange(2, vocab)
    times: dict[str, list[float]] = {name: [] for name in sides}
    print(f"tiny model {sum(p.numel() for p in base.parameters()) / 1e6:.2f}M params, vocab {vocab}, "
          f"{torch.get_num_threads()} threads; (a) {args.rows} rows, {args.prefix}-token shared prefix; "
          f"(b) copy batch of {COPY_BATCH}")
    for repeat in range(args.repeats + 1):  # round 0 warms up
        ids, real = sft_batch(args.rows, args.prefix, vocab, generator)
        copy_ids, copy_mask = copy_batch(pool, COPY_BATCH, generator)
        for name in sides:
            batch = (ids, real) if name in ("shared", "full") else (copy_ids, copy_mask.bool())
            ms = timed(lambda: train_step(models[name], optimizers[name], *batch, sides[name]))
            if repeat:
                times[name].append(ms)
    median = {name: statistics.median(t) for name, t in times.items()}
    for name, ms in median.items():
        print(f"{name:8s} {ms:8.1f} ms per step")
    print(f"ratio shared/full: {median['shared'] / median['full']:.3f}")
    print(f"ratio packed/padded: {median['packed'] / median['padded']:.3f}")


if __name__ == "__main__":
    main()
