"""The training forward pass: the rows' common prefix run once gives the full batch's outputs and gradients."""

import pytest
import torch
from helpers import build_tiny_model

from aepo_rl.models import enable_gradient_checkpointing
from aepo_rl.models.forward import (
    MIN_SHARED_PREFIX,
    common_prefix_length,
    decoder_hidden,
    language_model,
    lm_head,
    packed_hidden,
    recomputes_layers,
)


def test_common_prefix_length_counts_the_leading_positions_all_rows_share():
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 9], [5, 6, 1, 8]])
    assert common_prefix_length(ids) == 2
    assert common_prefix_length(ids[:2]) == 3
    assert common_prefix_length(ids[:1]) == 4
    assert common_prefix_length(torch.tensor([[1, 2], [3, 2]])) == 0  # a later match does not count


def _batch(prefix: int, generator: torch.Generator, rows: int = 5, width: int = 30, vocab: int = 300) -> torch.Tensor:
    """Right-padded rows (pad 0) of random tokens sharing their first ``prefix`` tokens."""
    ids = torch.randint(1, vocab, (rows, width), generator=generator)
    ids[:, :prefix] = ids[0, :prefix]
    for row, length in enumerate(torch.randint(prefix + 1, width + 1, (rows,), generator=generator).tolist()):
        ids[row, length:] = 0
    return ids


def _hidden_and_grads(model, ids: torch.Tensor, share_prefix: bool):
    model.zero_grad()
    hidden = decoder_hidden(model, ids, share_prefix=share_prefix)
    (lm_head(model, hidden) ** 2).mean().backward()
    return hidden.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("prefix", [MIN_SHARED_PREFIX, 20, 29])
def test_shared_prefix_gives_the_full_batch_outputs_and_gradients(tiny_tokenizer, prefix):
    model = build_tiny_model(tiny_tokenizer).train()
    ids = _batch(prefix, torch.Generator().manual_seed(prefix), vocab=len(tiny_tokenizer))
    assert common_prefix_length(ids) >= prefix
    shared, shared_grads = _hidden_and_grads(model, ids, share_prefix=True)
    full, full_grads = _hidden_and_grads(model, ids, share_prefix=False)
    assert shared.shape == full.shape == (5, 30, model.config.hidden_size)
    torch.testing.assert_close(shared, full, atol=1e-5, rtol=1e-4)
    for name, grad in full_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)
    # and the plain path is the model's own forward (no attention mask: right padding)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(lm_head(model, full), logits, atol=1e-5, rtol=1e-4)


def test_shared_prefix_runs_the_prefix_once(tiny_tokenizer, monkeypatch):
    model = build_tiny_model(tiny_tokenizer)
    ids = _batch(12, torch.Generator().manual_seed(0), vocab=len(tiny_tokenizer))
    seen = _spy_on_decoder(model, monkeypatch)
    decoder_hidden(model, ids)
    common = common_prefix_length(ids)
    assert seen == [(1, common), (5, 30 - common)]
    seen.clear()
    decoder_hidden(model, ids[:1])  # one row: nothing to share
    decoder_hidden(model, ids[:, :MIN_SHARED_PREFIX - 1])  # a prefix too short to be worth it
    assert seen == [(1, 30), (5, MIN_SHARED_PREFIX - 1)]


def test_shared_prefix_with_lora_adapters(tiny_tokenizer):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(build_tiny_model(tiny_tokenizer).train(),
                                peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                init_lora_weights=False))
    ids = _batch(16, torch.Generator().manual_seed(1), vocab=len(tiny_tokenizer))
    shared, shared_grads = _hidden_and_grads(model, ids, share_prefix=True)
    full, full_grads = _hidden_and_grads(model, ids, share_prefix=False)
    torch.testing.assert_close(shared, full, atol=1e-5, rtol=1e-4)
    lora = [name for name in full_grads if "lora_" in name]
    assert lora and all(full_grads[name].abs().sum() > 0 for name in lora)
    for name in lora:
        torch.testing.assert_close(shared_grads[name], full_grads[name], atol=1e-6, rtol=1e-4, msg=name)


def _spy_on_decoder(model, monkeypatch) -> list[tuple[int, ...]]:
    """The shapes of ``input_ids`` the model's decoder is called with, from now on."""
    seen = []
    decoder = model.get_decoder()
    original = decoder.forward

    def spy(*args, input_ids=None, **kwargs):
        seen.append(tuple(input_ids.shape))
        return original(*args, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(decoder, "forward", spy)
    return seen


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_runs_whole_rows_with_the_same_outputs_and_gradients(tiny_tokenizer, monkeypatch, lora):
    """Checkpointed layers drop the key/value cache (a shared prefix would be silently lost), so the
    training forward runs every row whole; a pass without gradients still shares the prefix."""
    model = build_tiny_model(tiny_tokenizer).train()
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False))
    ids = _batch(12, torch.Generator().manual_seed(3), vocab=len(tiny_tokenizer))
    plain, plain_grads = _hidden_and_grads(model, ids, share_prefix=False)
    assert not recomputes_layers(model)
    enable_gradient_checkpointing(language_model(model))
    assert recomputes_layers(model)
    seen = _spy_on_decoder(model, monkeypatch)
    checkpointed, grads = _hidden_and_grads(model, ids, share_prefix=True)
    assert seen == [tuple(ids.shape)]
    assert torch.equal(checkpointed, plain)
    for name, grad in plain_grads.items():
        assert torch.equal(grads[name], grad), name
    seen.clear()
    with torch.no_grad():
        decoder_hidden(model, ids)
    model.eval()
    decoder_hidden(model, ids)
    common = common_prefix_length(ids)
    assert seen == [(1, common), (5, 30 - common)] * 2


def test_packed_rows_give_the_padded_batch_at_every_real_token(tiny_tokenizer):
    from aepo_rl.models.copy_warmup import copy_batch

    model = build_tiny_model(tiny_tokenizer).train()
    ids, mask = copy_batch(torch.arange(10, len(tiny_tokenizer)), 16, torch.Generator().manual_seed(4))
    lengths = mask.sum(1)
    real = mask.bool()
    packed = packed_hidden(model, ids, lengths)
    padded = decoder_hidden(model, ids, share_prefix=False)
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-4)
    assert (packed[~real] == 0).all()
    grads = []
    for hidden in (packed, padded):
        model.zero_grad()
        (lm_head(model, hidden[real]) ** 2).mean().backward(retain_graph=True)
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    for name, grad in grads[1].items():
        torch.testing.assert_close(grads[0][name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_packing_fills_rows_first_fit(tiny_tokenizer, monkeypatch):
    model = build_tiny_model(tiny_tokenizer)
    decoder = model.get_decoder()
    original, seen = decoder.forward, []

    def spy(*args, input_ids=None, position_ids=None, **kwargs):
        seen.append((input_ids.clone(), position_ids.clone()))
        return original(*args, input_ids=input_ids, position_ids=position_ids, **kwargs)

    monkeypatch.setattr(decoder, "forward", spy)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 0, 0, 0, 0], [13, 14, 15, 16, 0, 0], [17, 0, 0, 0, 0, 0]])
    packed_hidden(model, ids, torch.tensor([6, 2, 4, 1]))
    (packed_ids, positions), = seen
    assert packed_ids.tolist() == [[5, 6, 7, 8, 9, 10], [13, 14, 15, 16, 11, 12], [17, 0, 0, 0, 0, 0]]
    assert positions.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5]]
