"""Tree rollouts on a real (tiny, random) Qwen3 through the HF engine: invariants of §1.1/§1.5.

The random model is steered into the tool protocol by a logit bias that depends only on the
input token (a subclass of the model, so the engine sees an ordinary causal LM): after
``</think>`` or ``</result>`` it opens ``<search>`` (or, less often, ``<answer>``); right after an
opening tag it may not close it; elsewhere the closing tags get a moderate boost. Everything
else is the random model's own sampling, so trajectories differ in length, calls and endings.
"""

from __future__ import annotations

import pytest
import torch
from fakes import EchoSearch
from helpers import CFG, _prompts, steer

from aepo_rl.config import RolloutConfig
from aepo_rl.engines.hf import HFEngine
from aepo_rl.rollout.tree import run_rollout


@pytest.fixture(scope="module")
def steered(tiny_model, tiny_tokenizer):
    return steer(tiny_model, tiny_tokenizer)


@pytest.mark.parametrize("mode, segment, scope", [("aepo", "latest", "path"), ("aepo", "previous", "prompt_round"),
                                                  ("independent", "latest", "path")])
def test_real_rollout_invariants(steered, tiny_tokenizer, mode, segment, scope):
    tok = tiny_tokenizer
    cfg = RolloutConfig(mode=mode, entropy_segment=segment, penalty_scope=scope, **CFG)
    result = run_rollout(HFEngine(steered, tok, seed=3), _prompts(tok, 2), {"search": EchoSearch()}, cfg, seed=5)
    prefix = tok.encode(" <result>\n", add_special_tokens=False)
    forks = calls = 0
    for group in result.groups:
        assert [t.traj_id for t in group] == list(range(4))
        for t in group:
            assert len(t.response_token_ids) <= 64 and t.num_tool_calls <= 3
            assert t.finish_reason in ("answer", "eos", "length", "call_limit", "empty_call", "no_call")
            assert t.response_text == tok.decode(t.response_token_ids, skip_special_tokens=False)
            assert len(t.loss_mask) == len(t.logprobs) == len(t.entropies) == len(t.response_token_ids)
            if t.parent_id is not None:
                forks += 1
                parent = group[t.parent_id]
                assert t.response_token_ids[:t.fork_token_index] == parent.response_token_ids[:t.fork_token_index]
            # mask 0 exactly on the result blocks: one block per call, each " <result>\n…\n</result>"
            spans, start = [], None
            for i, m in enumerate(t.loss_mask + [1]):
                if m == 0 and start is None:
                    start = i
                elif m == 1 and start is not None:
                    spans.append((start, i))
                    start = None
            assert len(spans) == t.num_tool_calls
            calls += t.num_tool_calls
            for (a, b), call, r in zip(spans, t.tool_calls, (r for r in t.rounds if r.tool_call)):
                assert b == r.end and t.response_token_ids[a:a + len(prefix)] == prefix[:b - a]
                block = tok.decode(t.response_token_ids[a:b], skip_special_tokens=False)
                assert block.startswith(" <result>\n") and call.result == f"found {call.arg}"
                assert block.endswith("\n</result>") or (b == len(t.response_token_ids) and t.finish_reason == "length")
            assert all(lp < 0 for lp, m in zip(t.logprobs, t.loss_mask) if m == 1)
            assert all(lp == 0 and e == 0 for lp, e, m in zip(t.logprobs, t.entropies, t.loss_mask) if m == 0)
    assert calls > 0
    assert (forks > 0) == (mode != "independent")


def test_forked_logprobs_equal_a_plain_forward(steered, tiny_tokenizer):
    """Token-in, token-out with KV reuse: a forked multi-round trajectory's log-probs equal one full forward."""
    cfg = RolloutConfig(mode="arpo", **dict(CFG, max_response_length=128, max_tokens_per_round=20))
    result = run_rollout(HFEngine(steered, tiny_tokenizer, seed=1), _prompts(tiny_tokenizer, 2),
                         {"search": EchoSearch()}, cfg, seed=2)
    child = max((t for g in result.groups for t in g if t.parent_id is not None),
                key=lambda t: (t.num_tool_calls, len(t.response_token_ids)))
    assert child.num_tool_calls >= 2
    ids = torch.tensor([child.prompt_token_ids + child.response_token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(steered(input_ids=ids).logits[0, :-1].float(), dim=-1)
    p = len(child.prompt_token_ids)
    expected = logp[p - 1:].gather(1, ids[0, p:, None])[:, 0]
    mask = torch.tensor(child.loss_mask, dtype=torch.bool)
    torch.testing.assert_close(torch.tensor(child.logprobs)[mask], expected[mask], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_aepo_rollout_command(tmp_path, capsys):
    """`aepo rollout` end to end: synthetic task, tiny random model, HF engine, JSONL + trees (~20-30 s here,
    most of it building the tiny model)."""
    import json

    from aepo_rl.cli import main

    out = tmp_path / "ro"
    code = main(["rollout", "--task", "synthetic", "--num-prompts", "2", "--out", str(out), "rollout.n=3",
                 "rollout.max_response_length=12", "rollout.premonitor_probe_tokens=4", "task.num_train=4",
                 "task.num_demonstrations=8", f"model.cache_dir={tmp_path / 'cache'}", f"trainer.run_dir={tmp_path}",
                 "model.tiny_init=random", "model.tiny_hidden_size=32",
                 "model.tiny_num_layers=1", "model.tiny_intermediate_size=64", "model.tiny_vocab_size=400",
                 "model.tiny_copy_steps=1"])
    assert code == 0
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == 6 and {r["traj_id"] for r in records} == {0, 1, 2}
    assert all(len(r["response_token_ids"]) <= 12 and len(r["loss_mask"]) == len(r["response_token_ids"])
               for r in records)
    text = capsys.readouterr().out
    assert "T0 global sample" in text and "rollout/global_samples" in text and "rollouts.jsonl" in text


def test_rollout_without_model_uses_the_newest_model_trained_on_the_task(tmp_path, monkeypatch):
    from aepo_rl.cli import main
    from aepo_rl.train.checkpoint import find_trained_model

    def run(name, task, checkpoints):
        folder = tmp_path / "runs" / name
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(f"task:\n  name: {task}\n")
        for checkpoint in checkpoints:
            (folder / "checkpoints" / checkpoint).mkdir(parents=True)
            (folder / "checkpoints" / checkpoint / "config.json").write_text("{}")
        return folder

    assert find_trained_model(tmp_path / "runs", "synthetic") is None
    sft_only = run("sft-run", "synthetic", ["sft"])
    assert find_trained_model(tmp_path / "runs", "synthetic") == sft_only / "checkpoints" / "sft"
    rl = run("rl-run", "synthetic", ["sft", "step_000002/model", "step_000004/model"])
    run("other-task", "file", ["sft"])
    assert find_trained_model(tmp_path / "runs", "synthetic") == rl / "checkpoints" / "step_000004" / "model"

    calls = []
    monkeypatch.setattr("aepo_rl.rollout.cli.rollout_main", lambda cfg, **kw: calls.append((cfg.model.path, kw)) or 0)
    runs = f"trainer.run_dir={tmp_path / 'runs'}"
    assert main(["rollout", "--out", str(tmp_path / "out"), runs]) == 0
    assert calls[-1][0] == str(rl / "checkpoints" / "step_000004" / "model")
    assert calls[-1][1]["found_model"] == rl / "checkpoints" / "step_000004" / "model"
    assert not calls[-1][1]["random_model"]
    assert main(["rollout", "--out", str(tmp_path / "out"), f"trainer.run_dir={tmp_path / 'none'}"]) == 0
    assert calls[-1][0] is None and calls[-1][1]["random_model"] and calls[-1][1]["found_model"] is None
