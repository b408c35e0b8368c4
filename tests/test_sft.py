"""Cold-start SFT: loss masks, the masked loss, the schedule, and that training learns."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import PIECES, demo

from aepo_rl.config import load_config
from aepo_rl.models import encode_prompt
from aepo_rl.train.sft import (
    SFTSample,
    collate,
    masked_lm_loss,
    run_sft,
    token_accuracy,
    tokenize_demonstration,
    trained_logits,
)


def test_prompt_and_tool_result_tokens_have_mask_zero(tiny_tokenizer):
    d = demo()
    sample = tokenize_demonstration(tiny_tokenizer, d, max_length=512)
    prompt = encode_prompt(tiny_tokenizer, d.example.messages)
    pieces = [tiny_tokenizer(text, add_special_tokens=False)["input_ids"] for text, _ in PIECES]
    assert sample.input_ids == prompt + pieces[0] + pieces[1] + pieces[2] + [tiny_tokenizer.eos_token_id]
    assert sample.loss_mask == ([0] * len(prompt) + [1] * len(pieces[0]) + [0] * len(pieces[1])
                                + [1] * len(pieces[2]) + [1])
    masked_text = tiny_tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m == 0])
    assert "Page 1" in masked_text and "<result>" in masked_text and "Velmora founder" not in masked_text
    assert tiny_tokenizer.decode(sample.input_ids[-1:]) == "<|im_end|>" and sample.loss_mask[-1] == 1
    short = tokenize_demonstration(tiny_tokenizer, d, max_length=10)
    assert short.input_ids == sample.input_ids[:10] and short.loss_mask == [0] * 10


def test_collate_right_pads():
    batch = collate([SFTSample([5, 6, 7], [0, 1, 1]), SFTSample([8], [1])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]


class FakeLM(torch.nn.Module):
    """A causal LM whose decoder outputs fixed hidden states and whose head is the identity."""

    def __init__(self, hidden_fn):
        super().__init__()
        self.hidden_fn = hidden_fn

    def get_decoder(self):
        return lambda input_ids, **kwargs: SimpleNamespace(last_hidden_state=self.hidden_fn(input_ids))

    def get_output_embeddings(self):
        return torch.nn.Identity()


def test_masked_loss_counts_only_trained_targets():
    logits = torch.tensor([[[2.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0]]])
    batch = {"input_ids": torch.tensor([[0, 1, 3]]), "attention_mask": torch.ones(1, 3, dtype=torch.long),
             "loss_mask": torch.tensor([[0.0, 1.0, 0.0]])}
    loss, count = masked_lm_loss(FakeLM(lambda ids: logits), batch, bf16=False)
    # only target 1 (predicted from position 0, logits [2,0,0,0]) is trained: -log softmax[1]
    assert count.item() == 1
    assert loss.item() == pytest.approx(2.0 + math.log(1 + 3 * math.exp(-2.0)))
    batch["loss_mask"] = torch.tensor([[0.0, 1.0, 1.0]])  # targets 1 and 3: mean of both
    second = math.log(math.e + 3)  # target 3 from position 1's logits [0, 1, 0, 0]
    loss, count = masked_lm_loss(FakeLM(lambda ids: logits), batch, bf16=False)
    assert count.item() == 2
    assert loss.item() == pytest.approx((2.0 + math.log(1 + 3 * math.exp(-2.0)) + second) / 2)


def test_trained_logits_of_a_padded_row_equal_those_of_the_row_alone(tiny_model, tiny_tokenizer):
    """Right padding (collate) must not change a real token's logits."""
    short = tokenize_demonstration(tiny_tokenizer, demo(), max_length=512)
    long = tokenize_demonstration(tiny_tokenizer, demo("Who was the founder of the Velmora Guild of Ayrith?"), 512)
    batch = collate([short, long], tiny_tokenizer.pad_token_id)
    assert batch["attention_mask"][0].sum() < batch["attention_mask"].shape[1]  # the short row is padded
    padded, _ = trained_logits(tiny_model, batch, bf16=False)
    alone, _ = trained_logits(tiny_model, collate([short], tiny_tokenizer.pad_token_id), bf16=False)
    torch.testing.assert_close(padded[:len(alone)], alone, atol=1e-5, rtol=1e-4)


def warmup_cosine(step: int, total_steps: int, warmup_ratio: float) -> float:
    """The SFT lr multiplier by hand: s/W for s < W = round(ratio·S), then ½(1 + cos(π (s−W)/(S−W)))."""
    warmup = round(warmup_ratio * total_steps)
    if step < warmup:
        return step / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total_steps - warmup)))


def oracle(vocab: int, wrong: tuple[int, ...] = ()) -> FakeLM:
    """Predicts the next token perfectly, except at the positions listed in ``wrong``."""

    def hidden(input_ids):
        nxt = torch.roll(input_ids, -1, dims=1)
        for pos in wrong:
            nxt[:, pos] = (nxt[:, pos] + 1) % vocab
        return F.one_hot(nxt, vocab).float()

    return FakeLM(hidden)


def test_answer_accuracy_checks_only_the_answer_span(tiny_tokenizer):
    sample = tokenize_demonstration(tiny_tokenizer, demo(), 512)
    ids, vocab = sample.input_ids, len(tiny_tokenizer)
    open_at = len(ids) - 1 - ids[::-1].index(tiny_tokenizer.convert_tokens_to_ids("<answer>"))
    close_at = len(ids) - 1 - ids[::-1].index(tiny_tokenizer.convert_tokens_to_ids("</answer>"))
    assert ids.count(tiny_tokenizer.convert_tokens_to_ids("<answer>")) == 2  # one in the system prompt
    n_trained = sum(sample.loss_mask[1:])

    def acc(wrong):
        return token_accuracy(oracle(vocab, wrong), [sample], tiny_tokenizer, batch_size=2, bf16=False)

    assert acc(()) == {"token_accuracy": 1.0, "answer_accuracy": 1.0}
    # predicting </answer> (the target at close_at, predicted from close_at - 1) wrong fails the answer
    assert acc((close_at - 1,)) == {"token_accuracy": (n_trained - 1) / n_trained, "answer_accuracy": 0.0}
    # the <answer> tag itself and the EOS after </answer> are outside the span
    assert acc((open_at - 1,))["answer_accuracy"] == 1.0
    assert acc((close_at,))["answer_accuracy"] == 1.0


def sft_cfg(**extra):
    return load_config(overrides={"sft.epochs": 15, "sft.batch_size": 4, "sft.lr": 3e-3, "sft.warmup_ratio": 0.1,
                                  **extra})


def test_sft_steps_reduce_the_loss_and_follow_the_schedule(tiny_model, tiny_tokenizer):
    model = copy.deepcopy(tiny_model)
    demos = [demo(f"Who founded Velmora {i}?") for i in range(8)]
    batch = collate([tokenize_demonstration(tiny_tokenizer, d, 512) for d in demos], tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        before = masked_lm_loss(model, batch, bf16=False)[0].item()
    cfg = sft_cfg()
    metrics = run_sft(cfg, model, tiny_tokenizer, demos, dev_demos=demos[:2])
    with torch.no_grad():
        after = masked_lm_loss(model, batch, bf16=False)[0].item()
    assert after < 0.5 * before
    assert metrics["steps"] == 30 and len(metrics["loss_curve"]) == 30
    assert metrics["lr_curve"] == pytest.approx([3e-3 * warmup_cosine(s, 30, 0.1) for s in range(30)])
    # W = 3: lr·s/W from 0 (transformers' warm-up rule, as in RL), then cosine: ½ lr half-way through the decay
    assert metrics["lr_curve"][:4] == pytest.approx([0.0, 1e-3, 2e-3, 3e-3])
    assert metrics["lr_curve"][3 + 27 // 2] == pytest.approx(1.5e-3 * (1 + math.cos(math.pi * 13 / 27)))
    assert metrics["dev/token_accuracy"] > 0.5 and metrics["tokens_per_s"] > 0
    assert not model.training


def test_sft_with_lora_leaves_a_plain_model_with_only_targets_changed(tiny_model, tiny_tokenizer):
    model = copy.deepcopy(tiny_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run_sft(sft_cfg(**{"model.lora_rank": 4, "sft.epochs": 2}), model, tiny_tokenizer, [demo()] * 4)
    after = model.state_dict()
    assert set(after) == set(before)  # merged back: no lora_ / base_layer names
    assert all(p.requires_grad for p in model.parameters())
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.split(".")[-2] in ("q_proj", "k_proj", "v_proj", "o_proj") for k in changed)
