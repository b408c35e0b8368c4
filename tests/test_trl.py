"""The TRL adapter (aepo_rl/integrations/trl, docs/trl.md) against TRL's real GRPOTrainer on the tiny model.

- AEPO options off: AEPOGRPOTrainer's loss and gradients equal the stock GRPOTrainer's on the same
  batch, for each supported ``loss_type`` (with KL, dual clip, tool mask, vLLM IS weights).
- AEPO options on: they equal aepo_rl's native ``aepo`` loss on the same tensors (a plain forward).
- One training step with the tree ``rollout_func``: n leaves per prompt sharing prefixes, tool
  tokens masked through ``env_mask``, finite loss, weights changed.
- The version gate's error.
"""

from __future__ import annotations

import copy
import importlib
import math
import sys

import pytest
import torch
from fakes import EchoSearch
from helpers import build_tiny_model, steer

from aepo_rl.algorithms import entropy_from_logits, get_policy_loss
from aepo_rl.config import AlgorithmConfig

pytestmark = pytest.mark.trl


@pytest.fixture(scope="module")
def adapter():
    return importlib.import_module("aepo_rl.integrations.trl")


def _config(cls, tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=8,
                gradient_accumulation_steps=2, report_to=[], use_cpu=True, save_strategy="no", logging_steps=1,
                seed=0, dataloader_num_workers=0, bf16=False)  # GRPOConfig defaults to bf16 autocast, on CPU too
    return cls(**{**base, **kw})


def _trainer(cls, config, tok, model=None):
    from datasets import Dataset

    model = build_tiny_model(tok) if model is None else model
    data = Dataset.from_dict({"prompt": ["who founded Velmora?"] * 8})
    trainer = cls(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
                  train_dataset=data, processing_class=tok)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps  # set by Trainer's loop
    return trainer


def _batch(tok, generator_seed=0, with_tool_mask=True):
    """A GRPO batch as _generate_and_score_completions leaves it: left-padded prompts, right-padded
    completions, a tool mask, advantages of both signs; old log-probs come later (they need the model)."""
    g = torch.Generator().manual_seed(generator_seed)
    pad = tok.pad_token_id
    prompt_lens, completion_lens = [5, 3, 4, 5], [8, 6, 8, 3]
    prompt_ids = torch.full((4, 5), pad)
    prompt_mask = torch.zeros(4, 5, dtype=torch.long)
    completion_ids = torch.full((4, 8), pad)
    completion_mask = torch.zeros(4, 8, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        prompt_ids[i, 5 - p:] = torch.randint(10, 300, (p,), generator=g)
        prompt_mask[i, 5 - p:] = 1
        completion_ids[i, :c] = torch.randint(10, 300, (c,), generator=g)
        completion_mask[i, :c] = 1
    batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
             "completion_mask": completion_mask, "advantages": torch.tensor([1.3, -0.8, 0.5, -1.6])}
    if with_tool_mask:
        tool_mask = torch.ones(4, 8, dtype=torch.long)
        tool_mask[0, 2:4] = 0
        tool_mask[2, 5:7] = 0
        batch["tool_mask"] = tool_mask
    mask = completion_mask * batch.get("tool_mask", 1)
    batch["num_items_in_batch"] = mask.sum() * 2  # the generation batch holds two such micro-batches
    return batch


def _plain_forward(model, batch, temperature=1.0):
    """log π(y_t) and H_t of the completion tokens from an ordinary forward (no TRL code)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width = batch["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=attention).logits[:, -width - 1:-1].float() / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, batch["completion_ids"][..., None]).squeeze(-1)
    return logp, entropy_from_logits(logits)


def _with_old_logps(model, batch, seed=1, spread=0.5):
    """Old log-probs = current ones moved by noise, so ratios cross both clip bounds and the dual clip."""
    with torch.no_grad():
        logp, _ = _plain_forward(model, batch)
    g = torch.Generator().manual_seed(seed)
    out = dict(batch)
    out["old_per_token_logps"] = logp + spread * torch.randn(logp.shape, generator=g)
    return out


def _loss_and_grads(trainer, batch):
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, copy.copy(batch))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def _assert_close(a, b, tol=1e-6):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert abs(loss_a.item() - loss_b.item()) <= tol, (loss_a.item(), loss_b.item())
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=tol, rtol=1e-5, msg=name)


@pytest.mark.parametrize("loss_type, extra", [
    ("dapo", {"steps_per_generation": 4}),
    ("bnpo", {"kl_beta": 0.05}),
    ("grpo", {"delta": 1.5}),
    ("dr_grpo", {"epsilon_high": 0.28, "vllm_is": True}),
])
def test_aepo_off_equals_stock_grpo(adapter, tiny_tokenizer, tmp_path, loss_type, extra):
    from trl import GRPOConfig, GRPOTrainer

    extra = dict(extra)
    vllm_is, beta = extra.pop("vllm_is", False), extra.pop("kl_beta", 0.0)
    stock = _trainer(GRPOTrainer, _config(GRPOConfig, tmp_path / "s", loss_type=loss_type, **extra), tiny_tokenizer)
    ours = _trainer(adapter.AEPOGRPOTrainer, _config(adapter.AEPOGRPOConfig, tmp_path / "a", loss_type=loss_type,
                                                     aepo_sg_upper_clip=False, aepo_entropy_adv_coef=0.0, **extra),
                    tiny_tokenizer)
    batch = _with_old_logps(stock.model, _batch(tiny_tokenizer))
    g = torch.Generator().manual_seed(7)
    if beta:  # set after init: a model object has no hub id for TRL to load the reference from
        for trainer in (stock, ours):
            trainer.beta = beta
        batch["ref_per_token_logps"] = batch["old_per_token_logps"] + 0.2 * torch.randn(4, 8, generator=g)
    if vllm_is:
        for trainer in (stock, ours):
            trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
        batch["importance_sampling_ratio"] = 0.5 + torch.rand(4, 8, generator=g)
    _assert_close(_loss_and_grads(ours, batch), _loss_and_grads(stock, batch))
    if loss_type in ("dapo", "grpo"):  # metrics under TRL's names agree too
        for name in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "entropy"):
            assert ours._metrics["train"][name][-1] == pytest.approx(stock._metrics["train"][name][-1], abs=1e-6)


@pytest.mark.parametrize("loss_type, extra", [
    ("bnpo", {"delta": 3.0}),
    ("dapo", {"aepo_grad_preserve_entropy_quantile": 0.5, "aepo_entropy_adv_clamp": True,
              "aepo_entropy_adv_coef": 1.5}),
])
def test_aepo_on_equals_native_aepo_loss(adapter, tiny_tokenizer, tmp_path, loss_type, extra):
    from trl import GRPOConfig, GRPOTrainer

    config = _config(adapter.AEPOGRPOConfig, tmp_path / "a", loss_type=loss_type, gradient_accumulation_steps=1,
                     **extra)
    ours = _trainer(adapter.AEPOGRPOTrainer, config, tiny_tokenizer)
    batch = _batch(tiny_tokenizer)
    batch["num_items_in_batch"] = (batch["completion_mask"] * batch["tool_mask"]).sum()  # one micro-batch
    batch = _with_old_logps(ours.model, batch)
    got = _loss_and_grads(ours, batch)

    # the same tensors: TRL's forward (log π, H of the completion tokens) on the same model, then the native loss
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    ours.model.zero_grad()
    logp, entropy, _ = ours._get_per_token_logps_and_entropies(ours.model, ids, attention, 8, compute_entropy=True)
    with torch.no_grad():  # and they are the policy's: an ordinary forward agrees
        plain_logp, plain_entropy = _plain_forward(ours.model, batch)
    mask = batch["completion_mask"] * batch["tool_mask"]
    keep = mask.bool()
    torch.testing.assert_close(logp[keep], plain_logp[keep], atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy[keep], plain_entropy[keep], atol=1e-4, rtol=0)
    cfg = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=extra.get("delta"),
                          entropy_adv_coef=extra.get("aepo_entropy_adv_coef", 0.2), entropy_adv_scope="micro-batch",
                          entropy_adv_clamp=extra.get("aepo_entropy_adv_clamp", False), sg_upper_clip=True,
                          grad_preserve_entropy_quantile=extra.get("aepo_grad_preserve_entropy_quantile"))
    loss, metrics = get_policy_loss("aepo")(batch["old_per_token_logps"], logp,
                                            batch["advantages"][:, None].expand_as(logp),
                                            mask, "token-mean", config=cfg, entropy=entropy)
    loss.backward()
    want = (loss.detach(), {n: p.grad.clone() for n, p in ours.model.named_parameters() if p.grad is not None})
    _assert_close(got, want)
    assert metrics["actor/grad_preserved_frac"] > 0  # the batch exercises the stop-gradient clip

    # and the AEPO options change the gradient: stock GRPO on the same batch differs
    stock = _trainer(GRPOTrainer, _config(GRPOConfig, tmp_path / "s", loss_type=loss_type,
                                          gradient_accumulation_steps=1,
                                          delta=extra.get("delta")), tiny_tokenizer)
    _, stock_grads = _loss_and_grads(stock, batch)
    assert max((got[1][n] - stock_grads[n]).abs().max().item() for n in stock_grads) > 1e-4


def test_tree_rollout_func_trains_one_step(adapter, tiny_tokenizer, tmp_path):
    """One optimizer step of AEPOGRPOTrainer with TreeRolloutFunc on the tiny model, steered into the
    tool protocol (tests/test_rollout_tiny.py; the steering bias is part of the model's forward, so
    it shapes sampling, while TRL's fused LM head trains the plain weights underneath)."""
    from datasets import Dataset

    tok = tiny_tokenizer
    model = steer(build_tiny_model(tok), tok)
    prompts = [f"<|im_start|>user\nwho founded Velmora {i}?<|im_end|>\n<|im_start|>assistant\n<think> x</think>"
               for i in range(2)]
    data = Dataset.from_dict({"prompt": prompts})
    seen = {}

    def calls_reward(prompts, completions, aepo_num_tool_calls, aepo_parent_id, **_):
        seen["parents"] = list(aepo_parent_id)
        return [float(c) for c in aepo_num_tool_calls]

    def length_reward(completions, **_):
        return [len(c) / 100 for c in completions]

    class Recording(adapter.AEPOGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            self.batch = super()._generate_and_score_completions(inputs)
            return self.batch

    n = 4
    config = _config(adapter.AEPOGRPOConfig, tmp_path, per_device_train_batch_size=2 * n, num_generations=n,
                     gradient_accumulation_steps=1, max_completion_length=40, max_steps=1, learning_rate=5e-3,
                     shuffle_dataset=False)
    rollout = adapter.TreeRolloutFunc([EchoSearch()], mode="aepo", global_samples=1, branch_threshold=0.0,
                                      max_tokens_per_round=10, max_tool_response_tokens=4, call_limit=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Recording(model=model, reward_funcs=[calls_reward, length_reward], args=config, train_dataset=data,
                        processing_class=tok, rollout_func=rollout)
    trainer.train()

    groups = rollout.last_result.groups
    assert [len(g) for g in groups] == [n, n]
    rows = [t for g in groups for t in g]
    forks = [t for t in rows if t.parent_id is not None]
    assert forks, "no branch was taken"
    for g in groups:
        for t in g:
            if t.parent_id is not None:  # a leaf shares its parent's tokens up to the fork
                parent = g[t.parent_id]
                assert t.fork_token_index > 0
                assert t.response_token_ids[:t.fork_token_index] == parent.response_token_ids[:t.fork_token_index]
    assert seen["parents"] == [t.parent_id for t in rows]

    batch = trainer.batch  # exactly the trajectories, row by row, tool results masked
    result = tok.convert_tokens_to_ids("<result>")
    masked_tool_tokens = 0
    for i, t in enumerate(rows):
        length = len(t.response_token_ids)
        assert batch["completion_ids"][i, :length].tolist() == t.response_token_ids
        assert batch["prompt_ids"][i, -len(t.prompt_token_ids):].tolist() == t.prompt_token_ids
        assert batch["tool_mask"][i, :length].tolist() == t.loss_mask
        for r in t.rounds:
            if r.tool_call is not None:
                tail = t.loss_mask[r.end - 1]
                assert tail == 0 and result in t.response_token_ids[r.start:r.end]
                masked_tool_tokens += t.loss_mask[r.start:r.end].count(0)
    assert masked_tool_tokens > 0

    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(math.isfinite(x) for x in losses)
    assert trainer.state.log_history[0]["aepo/rollout/branches_per_prompt"] > 0
    after = model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k != "steering")


def test_version_gate(adapter, monkeypatch):
    adapter.check_trl_version("1.16.0")
    adapter.check_trl_version("1.16.3")
    for bad in ("1.15.2", "1.17.0", "2.0.0"):
        with pytest.raises(ImportError, match=rf"trl>=1\.16,<1\.17.*trl {bad} is installed.*"
                                              r"pip install -e \".\[trl\]\" in the aepo-rl clone"):
            adapter.check_trl_version(bad)
    # the import itself refuses an untested TRL
    import trl

    saved = {name: mod for name, mod in sys.modules.items() if name.startswith("aepo_rl.integrations.trl")}
    monkeypatch.setattr(trl, "__version__", "1.17.1")
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    try:
        with pytest.raises(ImportError, match=r"trl 1\.17\.1 is installed"):
            importlib.import_module("aepo_rl.integrations.trl")
    finally:
        sys.modules.update(saved)


def test_config_and_rollout_errors_name_the_key(adapter, tiny_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="loss_type='cispo'"):
        _config(adapter.AEPOGRPOConfig, tmp_path, loss_type="cispo")
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        _config(adapter.AEPOGRPOConfig, tmp_path, top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match="delta=1.1 must be > 1 \\+ epsilon_high"):
        _config(adapter.AEPOGRPOConfig, tmp_path, delta=1.1)
    from trl import GRPOConfig

    with pytest.raises(TypeError, match="AEPOGRPOConfig"):
        _trainer(adapter.AEPOGRPOTrainer, _config(GRPOConfig, tmp_path), tiny_tokenizer)
    with pytest.raises(ValueError, match=r"\['n', 'temperature'\] come from the trainer's GRPOConfig"):
        adapter.TreeRolloutFunc([EchoSearch()], n=4, temperature=0.5)
    with pytest.raises(ValueError, match="unknown rollout keys \\['branch_treshold'\\]"):
        adapter.TreeRolloutFunc([EchoSearch()], branch_treshold=0.1)
    trainer = _trainer(adapter.AEPOGRPOTrainer, _config(adapter.AEPOGRPOConfig, tmp_path), tiny_tokenizer)
    rollout = adapter.TreeRolloutFunc([EchoSearch()])
    with pytest.raises(ValueError, match="not whole groups of num_generations=2"):
        rollout(["a", "a", "b"], trainer)
    with pytest.raises(ValueError, match="rows 0..1 are not one prompt repeated"):
        rollout(["a", "b"], trainer)
    trainer.args.mask_truncated_completions = True
    with pytest.raises(ValueError, match="set it to False"):
        rollout(["a", "a"], trainer)


def test_tree_rollout_func_in_evaluation_gives_independent_samples(adapter, tiny_tokenizer, tmp_path):
    config = _config(adapter.AEPOGRPOConfig, tmp_path, num_generations_eval=3)
    trainer = _trainer(adapter.AEPOGRPOTrainer, config, tiny_tokenizer)
    trainer.model.eval()
    rollout = adapter.TreeRolloutFunc([EchoSearch()], branch_threshold=0.0)
    out = rollout(["who founded Velmora?"] * 3, trainer)
    assert len(out["completion_ids"]) == 3 and out["aepo_parent_id"] == [None] * 3
    assert all(0 < len(ids) <= 8 and len(mask) == len(ids) for ids, mask in zip(out["completion_ids"], out["env_mask"]))
    assert out["prompt_ids"][0] == tiny_tokenizer("who founded Velmora?")["input_ids"]


def test_tree_rollout_func_records_the_log_probs_trl_compares_with(adapter, tiny_tokenizer, tmp_path):
    """TRL's own log-probs are of logits / temperature; with logprobs_mode='processed_logprobs' the rollout's are
    the same distribution's, and TRL's off-policy sequence mask (which compares the two) refuses the raw ones."""
    config = _config(adapter.AEPOGRPOConfig, tmp_path, num_generations_eval=2, temperature=0.5)
    trainer = _trainer(adapter.AEPOGRPOTrainer, config, tiny_tokenizer)
    trainer.model.eval()
    for mode, scale in (("processed_logprobs", 0.5), ("raw_logprobs", 1.0)):
        out = adapter.TreeRolloutFunc([EchoSearch()], logprobs_mode=mode)(["who founded Velmora?"] * 2, trainer)
        for prompt, ids, logprobs, mask in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"],
                                               out["env_mask"]):
            with torch.no_grad():
                logits = trainer.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
            expected = torch.log_softmax(logits / scale, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            model_tokens = torch.tensor(mask, dtype=torch.bool)
            torch.testing.assert_close(torch.tensor(logprobs)[model_tokens], expected[model_tokens], atol=1e-4,
                                       rtol=1e-4, msg=mode)
    trainer.args.off_policy_mask_threshold = 0.5
    with pytest.raises(ValueError, match=r"off_policy_mask_threshold .* logprobs_mode='processed_logprobs'"):
        adapter.TreeRolloutFunc([EchoSearch()])(["who founded Velmora?"] * 2, trainer)
    adapter.TreeRolloutFunc([EchoSearch()], logprobs_mode="processed_logprobs")(["who founded Velmora?"] * 2, trainer)
    with pytest.raises(ValueError, match="TreeRolloutFunc: rollout.entropy_measure=surprisal"):
        adapter.TreeRolloutFunc([EchoSearch()], logprobs_mode="processed_logprobs", entropy_measure="surprisal")


def _half_the_time_a_search(tok, system: str):
    """The tiny model taught, after ``system`` and the docs' question, to open with a search half the time and to
    answer straight away the other half: a policy whose group rewards can differ, like a checkpoint of aepo train."""
    from aepo_rl.protocol import Protocol

    torch.manual_seed(0)
    model = build_tiny_model(tok).train()
    prompt = tok.apply_chat_template([{"role": "system", "content": system},
                                      {"role": "user", "content": "Who founded Velmora?"}],
                                     add_generation_prompt=True, tokenize=True)["input_ids"]
    replies = ["<search>Velmora founder</search>", Protocol.format_answer("Ada Korrin") + "<|im_end|>"]
    rows = [list(prompt) + tok.encode(reply, add_special_tokens=False) for reply in replies]
    width = max(map(len, rows))
    ids = torch.tensor([row + [tok.pad_token_id] * (width - len(row)) for row in rows])
    labels = ids.clone()
    labels[:, :len(prompt)] = -100
    labels[ids == tok.pad_token_id] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        optimizer.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
    return model.eval()


@pytest.mark.slow
def test_the_docs_example_learns_as_written(adapter, tiny_tokenizer, tmp_path, monkeypatch):
    """docs/trl.md's ten lines, run as written: the prompt carries the protocol's system message, so a model that
    follows the protocol calls the tool in some trajectories and not in others, and not every group has rewards
    all equal (TRL's frac_reward_zero_std < 1: the step has a gradient)."""
    from pathlib import Path

    from aepo_rl.tools import get_tool

    text = (Path(__file__).resolve().parents[1] / "docs" / "trl.md").read_text()
    block = text.split("## Ten lines", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    system = adapter.TreeRolloutFunc([get_tool("search", corpus="synthetic")]).system_prompt()
    assert "rollout.system_prompt()" in block and "<search>query</search>" in system
    model = _half_the_time_a_search(tiny_tokenizer, system)
    folder = tmp_path / "runs/my-run/checkpoints/step_000020/model"
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "docs/trl.md", "exec"), namespace)
    logged = namespace["trainer"].state.log_history[0]
    calls = [t.num_tool_calls for group in namespace["rollout"].last_result.groups for t in group]
    assert 0 < sum(min(c, 1) for c in calls) < len(calls), calls
    assert logged["frac_reward_zero_std"] < 1, logged
