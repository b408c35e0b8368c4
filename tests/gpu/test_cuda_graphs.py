"""The HF engine's decode step captured as CUDA graphs (rollout.cuda_graphs, aepo_rl/engines/static.py):
replayed graphs give the eager static step's and the dynamic path's tokens and log-probs, the step
makes no host sync, graphs are kept across calls and recaptured after a weight reload. Marked
``gpu``; skipped where torch sees no CUDA device (docs/gpu.md)."""

from __future__ import annotations

import pytest
import torch
from helpers import build_tiny_model, script

from aepo_rl.engines.base import SamplingParams
from aepo_rl.engines.hf import HFEngine

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the gpu tests need one")]


def _engines(model, tokenizer):
    graphs = HFEngine(model, tokenizer, seed=3, cuda_graphs="on")
    eager = HFEngine(model, tokenizer, seed=3, cuda_graphs="on")
    eager.static.capture = False  # the same static step, run eagerly
    return graphs, eager, HFEngine(model, tokenizer, seed=3, cuda_graphs="off")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graphs_replay_the_eager_step(tiny_tokenizer, dtype):
    """The graph replays the eager step's kernels: the same tokens, and statistics within rounding (a kernel
    chosen differently under capture may move a bf16 logit by one unit); fp32 also matches the dynamic path."""
    model = build_tiny_model(tiny_tokenizer, seed=1, dtype=dtype).cuda()
    graphs, eager, dynamic = _engines(model, tiny_tokenizer)
    params = SamplingParams(temperature=1.0, top_p=0.95)
    runs = [script(engine, tiny_tokenizer, params)[1] for engine in (graphs, eager, dynamic)]
    assert graphs.static.graphs_captured > 0 and eager.static.graphs_captured == 0
    for g, e, d in zip(*runs, strict=True):
        assert g.token_ids == e.token_ids
        for name in ("logprobs", "entropies"):
            torch.testing.assert_close(torch.tensor(getattr(g, name)), torch.tensor(getattr(e, name)),
                                       atol=2e-2, rtol=0)
        if dtype == torch.float32:
            assert g.token_ids == d.token_ids
            torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(d.logprobs), atol=1e-4, rtol=0)


def test_the_step_makes_no_host_sync_and_graphs_are_kept_until_a_reload(tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer, seed=1).cuda()
    engine = HFEngine(model, tiny_tokenizer, seed=0, cuda_graphs="on")
    prompt = tiny_tokenizer.encode("<think>I need", add_special_tokens=False)
    engine.generate([engine.add_sequence(prompt) for _ in range(3)], SamplingParams(), [6, 6, 6])
    (rows, columns), replay = next(iter(engine.static._steps.items()))
    step = engine.static._eager_step(rows, columns)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()  # the eager step: an implicit sync (.item(), a data-dependent shape) raises here
        replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    captured = engine.static.graphs_captured
    engine.generate([engine.add_sequence(prompt) for _ in range(3)], SamplingParams(), [6, 6, 6])
    assert engine.static.graphs_captured == captured  # same buckets: replayed, not recaptured
    model.load_state_dict(build_tiny_model(tiny_tokenizer, seed=2).cuda().state_dict(), assign=True)
    engine.generate([engine.add_sequence(prompt) for _ in range(3)], SamplingParams(), [6, 6, 6])
    assert engine.static.graphs_captured > captured
