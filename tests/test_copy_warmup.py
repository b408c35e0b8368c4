"""The tiny model's copy warm-up: its data and its training loop."""

import pytest
import torch
from helpers import build_tiny_model

from aepo_rl.models.copy_warmup import (
    COPY_LENGTHS,
    copy_batch,
    copy_warmup,
    induction_circuit,
    repeated_half,
    repeated_half_accuracy,
)


def test_copy_batch_rows_are_a_random_sequence_twice():
    pool = torch.arange(50, 90)
    ids, mask = copy_batch(pool, 16, torch.Generator().manual_seed(0))
    lengths = mask.sum(1)
    assert ids.shape == (16, 2 * COPY_LENGTHS[1]) and set(mask.unique().tolist()) == {0, 1}
    for row, n in zip(ids, lengths.tolist()):
        half = n // 2
        assert n % 2 == 0 and COPY_LENGTHS[0] <= half <= COPY_LENGTHS[1]
        assert row[:half].tolist() == row[half:n].tolist()
        assert all(50 <= t < 90 for t in row[:n].tolist())
    assert len(set(lengths.tolist())) > 1  # lengths vary


def test_copy_warmup_trains_deterministically_and_never_samples_special_tokens(tiny_tokenizer, monkeypatch):
    seen = []
    original = copy_batch

    def spy(pool, batch_size, generator):
        seen.append(set(pool.tolist()))
        return original(pool, batch_size, generator)

    monkeypatch.setattr("aepo_rl.models.copy_warmup.copy_batch", spy)
    first, second = build_tiny_model(tiny_tokenizer), build_tiny_model(tiny_tokenizer)
    before = [p.detach().clone() for p in first.parameters()]
    losses = copy_warmup(first, tiny_tokenizer, steps=3, seed=5)
    copy_warmup(second, tiny_tokenizer, steps=3, seed=5)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(a, b) for a, b in zip(before, first.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    special = set(tiny_tokenizer.all_special_ids) | set(tiny_tokenizer.get_added_vocab().values())
    assert seen and not seen[0] & special and not first.training


def test_repeated_half_marks_the_second_copy_after_its_first_token():
    ids, mask = copy_batch(torch.arange(10, 60), 8, torch.Generator().manual_seed(2))
    targets = repeated_half(mask)  # over next-token targets ids[:, 1:]
    for row, n in enumerate((mask.sum(1) // 2).tolist()):
        # the second copy's tokens 2..n (positions n + 1 .. 2n - 1) are the targets n .. 2n - 2
        assert targets[row].nonzero().flatten().tolist() == list(range(n, 2 * n - 1))


def test_repeated_half_accuracy_scores_the_second_copy_after_its_first_token():
    ids, mask = copy_batch(torch.arange(10, 60), 8, torch.Generator().manual_seed(1))
    vocab, real = 64, mask[:, 1:].bool()  # the function takes logits at the real targets only
    perfect = torch.nn.functional.one_hot(ids[:, 1:], vocab).float()  # predicts every next token
    assert repeated_half_accuracy(perfect[real], ids, mask) == 1.0
    lengths = mask.sum(1) // 2
    wrong_first_half = perfect.clone()
    for row, n in enumerate(lengths.tolist()):
        wrong_first_half[row, :n - 1] = 0  # the first copy is unpredictable and not scored
        wrong_first_half[row, 2 * n - 1:] = 0  # nor is padding
    assert repeated_half_accuracy(wrong_first_half[real], ids, mask) == 1.0
    assert repeated_half_accuracy(torch.zeros(int(real.sum()), vocab), ids, mask) < 0.2


def test_copy_warmup_stops_once_the_model_copies(tiny_tokenizer, monkeypatch):
    monkeypatch.setattr("aepo_rl.models.copy_warmup.COPY_TARGET", 0.0)  # any model "copies"
    model = build_tiny_model(tiny_tokenizer)
    before = [p.detach().clone() for p in model.parameters()]
    assert copy_warmup(model, tiny_tokenizer, steps=50, seed=5) == []
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(copy_warmup(model, tiny_tokenizer, steps=50, seed=5, min_steps=3)) == 3  # then stops at once


def _copy_model(tokenizer, seed=0, head_dim=32, hidden=64, heads=2, kv_heads=2):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                         tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _copy_accuracy(model, tokenizer) -> float:
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    pool = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    ids, mask = copy_batch(pool, 64, torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1][mask[:, 1:].bool()]
    return repeated_half_accuracy(logits, ids, mask)


def test_induction_circuit_copies_from_the_first_step(tiny_tokenizer):
    model = _copy_model(tiny_tokenizer)
    assert _copy_accuracy(model, tiny_tokenizer) < 0.2  # random weights do not copy
    induction_circuit(model, seed=0)
    assert _copy_accuracy(model, tiny_tokenizer) > 0.85
    assert len(copy_warmup(model, tiny_tokenizer, steps=200, seed=5)) < 100  # the warm-up reaches its target soon


def test_induction_circuit_heads_attend_to_the_previous_and_the_matching_position(tiny_tokenizer):
    model = _copy_model(tiny_tokenizer, seed=1)
    induction_circuit(model, seed=1)
    model.set_attn_implementation("eager")
    x = torch.randint(300, len(tiny_tokenizer) - 10, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        attentions = model(torch.cat([x, x], 1), output_attentions=True).attentions
    previous, matching = attentions[0][0, 0], attentions[1][0, 0]
    assert all(previous[i, i - 1] > 0.9 for i in range(1, 24))
    assert all(matching[12 + m, m + 1] > 0.5 for m in range(11))  # the token after the earlier copy


def test_induction_circuit_names_the_sizes_it_needs(tiny_tokenizer):
    with pytest.raises(ValueError, match="head_dim.*model.tiny_init=random"):
        induction_circuit(_copy_model(tiny_tokenizer, head_dim=16))


@pytest.mark.parametrize("hidden, head_dim, heads, kv_heads", [(128, 32, 2, 2), (128, 32, 4, 2), (192, 32, 4, 4)])
def test_the_circuit_spreads_over_heads_when_a_head_is_narrower_than_half_the_stream(tiny_tokenizer, hidden, head_dim,
                                                                                      heads, kv_heads):
    """ceil(hidden/2 / head_dim) key/value heads carry the half each layer moves (under GQA the first query head of
    each group): the model copies from the first step at any such shape."""
    model = _copy_model(tiny_tokenizer, hidden=hidden, head_dim=head_dim, heads=heads, kv_heads=kv_heads)
    induction_circuit(model, seed=0)
    assert _copy_accuracy(model, tiny_tokenizer) > 0.85


def test_the_warm_up_keeps_the_circuit_at_twice_the_default_width(tiny_tokenizer):
    """At 256 wide (4 heads of 64) the warm-up's first steps leave the circuit copying. With the default width's
    logit scale (the final norm's weight not scaled by 128/width) they took it apart (0.93 → 0.02 after 25 steps
    at 256 wide; lab/notebook.md)."""
    model = _copy_model(tiny_tokenizer, seed=2, hidden=256, head_dim=64, heads=4, kv_heads=4)
    induction_circuit(model, seed=2)
    assert model.model.norm.weight[0].item() == pytest.approx(0.1)  # LOGIT_SCALE · 128 / 256
    copy_warmup(model, tiny_tokenizer, steps=30, seed=5, min_steps=30)
    assert _copy_accuracy(model, tiny_tokenizer) > 0.8
