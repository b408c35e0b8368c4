"""The HF engine's static decode path (rollout.cuda_graphs, aepo_rl/engines/static.py) on the CPU: the
same tokens, log-probs and entropies as the dynamic path through tool rounds, forks, ragged rows and a
tree rollout; a capture-safety proxy of the step; buffers and steps dropped when parameters are
replaced. The capture itself needs a GPU (tests/gpu/test_cuda_graphs.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from fakes import EchoSearch
from helpers import CFG, _prompts, encode, script, steer

from aepo_rl.config import RolloutConfig, load_config
from aepo_rl.engines import build_engine
from aepo_rl.engines.base import SamplingParams
from aepo_rl.engines.hf import HFEngine
from aepo_rl.engines.static import COLUMN_BUCKET, decode_path, row_bucket
from aepo_rl.rollout.tree import run_rollout


def bucket_shapes(engine: HFEngine) -> HFEngine:
    """Run the eager static step over the whole column bucket, as a captured step does on CUDA."""
    engine.static.live_width = False
    return engine


def step_widths(model) -> tuple[list[int], object]:
    """Record the key/value columns of every static decode step (the ones given a 4-D mask); returns the
    list and the hook's handle."""
    widths = []

    def record(module, args, kwargs):
        if kwargs["attention_mask"].dim() == 4:
            widths.append(kwargs["attention_mask"].shape[-1])

    return widths, model.register_forward_pre_hook(record, with_kwargs=True)


@pytest.mark.parametrize("shapes", ["live", "bucket"])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, top_p=0.95),
                                    SamplingParams(greedy=True, stop=("</search>", "Velmora")),
                                    SamplingParams(min_tokens=3, repetition_penalty=1.3, top_k=40)],
                         ids=["sampled", "greedy-stops", "min-tokens-penalty"])
def test_static_path_gives_the_dynamic_paths_tokens_logprobs_and_entropies(untied_model, tiny_tokenizer, params,
                                                                           shapes):
    """Both column shapes of the step: the live width (eager on the CPU) and the whole bucket (captured)."""
    dynamic = HFEngine(untied_model, tiny_tokenizer, seed=3, cuda_graphs="off")
    static = HFEngine(untied_model, tiny_tokenizer, seed=3, cuda_graphs="on")
    assert dynamic.static is None and static.static is not None and static.static.live_width
    if shapes == "bucket":
        bucket_shapes(static)
    _, expected = script(dynamic, tiny_tokenizer, params)
    rec, got = script(static, tiny_tokenizer, params)
    assert sum(len(s.token_ids) for s in got) > 80
    for e, g in zip(expected, got, strict=True):
        assert g.token_ids == e.token_ids
        assert (g.finish_reason, g.stop_string) == (e.finish_reason, e.stop_string)
        for name in ("logprobs", "entropies", "top10_entropies"):
            torch.testing.assert_close(torch.tensor(getattr(g, name)), torch.tensor(getattr(e, name)),
                                       atol=1e-5, rtol=0)
    assert static.stats() == dynamic.stats()
    for seq in rec.records:
        assert static.token_ids(seq) == dynamic.token_ids(seq)
        assert rec.max_error(untied_model, seq) < 1e-4
    steps = set(static.static._steps)
    if shapes == "live":
        assert not steps  # nothing kept: the width changes every step
        return
    assert {rows for rows, _ in steps} >= {8, 4, 1}
    assert {cols for _, cols in steps} >= {COLUMN_BUCKET, 2 * COLUMN_BUCKET}


def test_dead_rows_stay_in_the_batch_until_half_are_dead(tiny_model, tiny_tokenizer):
    batch_sizes = []
    hook = tiny_model.model.embed_tokens.register_forward_pre_hook(lambda m, args: batch_sizes.append(args[0].shape))
    try:
        engine = HFEngine(tiny_model, tiny_tokenizer, cuda_graphs="on")
        seqs = [engine.add_sequence([5 + i, 6, 7]) for i in range(8)]
        engine.generate(seqs, SamplingParams(ignore_eos=True), [2, 3, 3, 3, 3, 6, 6, 6])
    finally:
        hook.remove()
    # prefill (eager); 8 rows; 7 live and 1 dead row: still 8; 3 live: compacted to 4 rows (1 padding row)
    assert [tuple(s) for s in batch_sizes] == [(8, 3), (8, 1), (8, 1), (4, 1), (4, 1), (4, 1)]


def test_eager_steps_attend_over_the_live_columns_only(tiny_model, tiny_tokenizer):
    """On the CPU the step reads the columns in use (a growing width), not the whole bucket: the masked
    columns would cost as much as real ones (docs/benchmarks.md)."""
    widths, hook = step_widths(tiny_model)
    try:
        engine = HFEngine(tiny_model, tiny_tokenizer, cuda_graphs="on")
        seqs = [engine.add_sequence([5 + i, 6, 7]) for i in range(3)]
        engine.generate(seqs, SamplingParams(ignore_eos=True), [2, 5, 4])
        engine.append(seqs[0], [8, 9])
        engine.generate(seqs, SamplingParams(ignore_eos=True), [3, 1, 2])
        live = list(widths)
        widths.clear()
        bucket_shapes(engine).generate(seqs, SamplingParams(ignore_eos=True), [2, 2, 2])
    finally:
        hook.remove()
    # call 1: 3 prompt columns, then 4 steps; call 2: the longest row's 7 cached columns and 3 pending ones
    # (a generated token and the 2 appended ones), then 2 steps
    assert live == [4, 5, 6, 7] + [11, 12]
    assert widths == [COLUMN_BUCKET]  # the captured shape, run eagerly


def test_tree_rollout_is_the_same_on_both_paths(tiny_model, tiny_tokenizer):
    steered = steer(tiny_model, tiny_tokenizer)
    cfg = RolloutConfig(mode="aepo", **CFG)
    results = [run_rollout(HFEngine(steered, tiny_tokenizer, seed=3, cuda_graphs=mode), _prompts(tiny_tokenizer, 2),
                           {"search": EchoSearch()}, cfg, seed=5) for mode in ("off", "on")]
    trajectories = [[t for g in r.groups for t in g] for r in results]
    assert sum(t.num_tool_calls for t in trajectories[0]) > 0
    assert any(t.parent_id is not None for t in trajectories[0])
    for e, g in zip(*trajectories, strict=True):
        assert (g.response_token_ids, g.loss_mask, g.finish_reason, g.parent_id) == \
               (e.response_token_ids, e.loss_mask, e.finish_reason, e.parent_id)
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(e.logprobs), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(g.entropies), torch.tensor(e.entropies), atol=1e-5, rtol=0)


def _prepared_step(engine: HFEngine, tok):
    """Decode once so the buffers hold a real batch; returns the eager step of its bucket and its rows."""
    seqs = [engine.add_sequence(encode(tok, text)) for text in ("<think>I need", "The quick brown fox")]
    engine.generate(seqs, SamplingParams(), [5, 3])
    rows, columns = next(iter(engine.static._steps))
    return engine.static._eager_step(rows, columns), rows


def test_capture_safety_proxy_the_step_compiles_as_one_graph(tiny_model, tiny_tokenizer):
    """What a CUDA graph forbids inside the step (a host sync such as ``.item()``, a branch on a tensor's
    value, a shape that changes) breaks a ``fullgraph`` trace too: the step traces whole and gives the
    same logits."""
    engine = bucket_shapes(HFEngine(tiny_model, tiny_tokenizer, cuda_graphs="on"))
    step, rows = _prepared_step(engine, tiny_tokenizer)
    logits = engine.static._buffers.logits
    with torch.inference_mode():
        step()
        eager = logits[:rows].clone()
        logits.zero_()
        torch.compile(step, fullgraph=True, backend="eager")()
    torch.testing.assert_close(logits[:rows], eager, atol=1e-6, rtol=0)


def test_capture_safety_proxy_catches_a_host_sync(tiny_model, tiny_tokenizer):
    """The proxy can fail: the same step with a ``.item()`` on the column does not trace."""
    engine = bucket_shapes(HFEngine(tiny_model, tiny_tokenizer, cuda_graphs="on"))
    step, _ = _prepared_step(engine, tiny_tokenizer)
    column = engine.static._buffers.column

    def synced_step():
        if column.item() >= 0:
            step()

    torch._dynamo.reset()
    with torch.inference_mode(), pytest.raises(Exception, match="(?i)item|graph break|data-dependent"):
        torch.compile(synced_step, fullgraph=True, backend="eager")()


def test_replaced_parameters_drop_the_steps_in_place_updates_keep_them(tiny_tokenizer):
    from helpers import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, seed=4)
    engine = bucket_shapes(HFEngine(model, tiny_tokenizer, seed=0, cuda_graphs="on"))
    prompt = encode(tiny_tokenizer, "<think>I need")

    def greedy(mode):
        engine_ = engine if mode == "on" else HFEngine(model, tiny_tokenizer, cuda_graphs="off")
        return engine_.generate([engine_.add_sequence(prompt)], SamplingParams(greedy=True), [6])[0]

    def same(got, expected):
        assert got.token_ids == expected.token_ids
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(expected.logprobs), atol=1e-5, rtol=0)

    same(greedy("on"), greedy("off"))
    buffers, steps = engine.static._buffers, dict(engine.static._steps)
    with torch.no_grad():  # an optimizer step: in place, same storage
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    same(greedy("on"), greedy("off"))  # the kept steps read the updated weights
    assert engine.static._buffers is buffers and engine.static._steps == steps
    model.load_state_dict(build_tiny_model(tiny_tokenizer, seed=5).state_dict(), assign=True)  # new storage
    same(greedy("on"), greedy("off"))
    assert engine.static._buffers is not buffers
    assert all(engine.static._steps[key] is not steps[key] for key in engine.static._steps)


def test_decode_path_resolution():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")

    def path(*args):
        resolved = decode_path(*args)
        return resolved.static, resolved.capture, resolved.strict

    assert path("auto", cpu, "sdpa") == (False, False, False)  # not bitwise the same: docs/benchmarks.md
    assert path("auto", cuda, "sdpa") == (True, True, False)
    assert path("auto", cuda, "flash_attention_2") == (False, False, False)
    assert path("on", cpu, "eager") == (True, False, True)
    assert path("on", cuda, "sdpa") == (True, True, True)
    assert path("off", cuda, "sdpa") == (False, False, False)
    with pytest.raises(ValueError, match="rollout.cuda_graphs=on needs an attention implementation"):
        decode_path("on", cuda, "flash_attention_2")
    with pytest.raises(ValueError, match="rollout.cuda_graphs must be one of"):
        decode_path("yes", cpu, "sdpa")
    assert [row_bucket(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]


def test_eager_attention_gets_an_additive_mask(untied_model, tiny_tokenizer):
    model = copy.deepcopy(untied_model)
    model.config._attn_implementation = "eager"
    params = SamplingParams(temperature=1.0)
    _, expected = script(HFEngine(model, tiny_tokenizer, seed=1, cuda_graphs="off"), tiny_tokenizer, params)
    _, got = script(HFEngine(model, tiny_tokenizer, seed=1, cuda_graphs="on"), tiny_tokenizer, params)
    for e, g in zip(expected, got, strict=True):
        assert g.token_ids == e.token_ids
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(e.logprobs), atol=1e-5, rtol=0)


def test_rollout_cuda_graphs_reaches_the_engine(tiny_model, tiny_tokenizer):
    engines = {mode: build_engine(load_config("aepo", None, [f"rollout.cuda_graphs={mode}"]), tiny_model,
                                  tiny_tokenizer)
               for mode in ("auto", "on", "off")}
    assert engines["auto"].static is None and engines["off"].static is None  # auto on the CPU: dynamic
    assert engines["on"].static is not None
