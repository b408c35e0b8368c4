"""The training forward pass: hidden states of right-padded rows, the rows' common prefix computed once.

Every training batch here (copy warm-up, SFT, the RL update and the old policy's log-probs) holds
right-padded rows under causal attention, so no attention mask is needed: a real token never
attends to a pad that follows it, and positions count from 0 in every row. And every row of an
SFT or RL batch starts with the same tokens: the chat template's system message (55 of the
synthetic task's ~120 tokens per demonstration). :func:`decoder_hidden` runs that common prefix
once, for one row, and the rest of every row on top of its key/value cache repeated over the
batch. Causal attention makes this the same computation as the full batch (outputs equal up to
float summation order), gradients included: the prefix's activations are in the graph once and
receive the sum of every row's gradient. Under gradient checkpointing transformers drops the
cache inside each recomputed layer, so a training forward then runs every row whole; passes
without gradients (the old policy's log-probs) still share the prefix.

The copy warm-up's rows share nothing but are a third padding: :func:`packed_hidden` packs them
into fewer rows (block-causal attention, positions restarting per sequence) and unpacks the
result. Only the positions whose logits are needed go through the LM head (:func:`lm_head`): a
vocabulary projection of every position is a large part of a tiny model's work.
"""

from __future__ import annotations

import inspect

import torch

MIN_SHARED_PREFIX = 8
"""Shortest common prefix worth a separate forward pass (tokens)."""


def language_model(model):
    """The transformers LM under a peft wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def common_prefix_length(input_ids: torch.Tensor) -> int:
    """Number of leading positions at which every row of ``input_ids`` [B, T] holds the same token."""
    same = (input_ids == input_ids[:1]).all(0)
    return int(same.long().cumprod(0).sum())


def recomputes_layers(model) -> bool:
    """Whether this forward runs under gradient checkpointing (enabled, training mode, gradients on).
    transformers then drops the key/value cache inside every layer, so a forward cannot continue
    from a cached prefix."""
    lm = language_model(model)
    enabled = getattr(lm, "is_activation_checkpointing", None)  # transformers 5; before: is_gradient_checkpointing
    if enabled is None:
        enabled = getattr(lm, "is_gradient_checkpointing", False)
    return bool(enabled) and lm.training and torch.is_grad_enabled()


def decoder_hidden(model, input_ids: torch.Tensor, share_prefix: bool = True) -> torch.Tensor:
    """Last hidden states [B, T, H] of right-padded ``input_ids`` [B, T] (no attention mask).

    With ``share_prefix`` the rows' common prefix (when at least :data:`MIN_SHARED_PREFIX`
    tokens, and at least one token of every row after it) runs once, and the rest of the rows
    continue from its cache. For decoders whose forward takes ``past_key_values`` (every
    transformers causal LM). Under gradient checkpointing (:func:`recomputes_layers`) every row
    runs whole: the layers would drop the prefix's cache."""
    decoder = language_model(model).get_decoder()
    rows, width = input_ids.shape
    share_prefix = share_prefix and rows > 1 and not recomputes_layers(model)
    shared = min(common_prefix_length(input_ids), width - 1) if share_prefix else 0
    if shared < MIN_SHARED_PREFIX:
        return decoder(input_ids=input_ids, use_cache=False).last_hidden_state
    from transformers import DynamicCache

    cache = DynamicCache()
    cache_kwarg = "cache" if "cache" in inspect.signature(type(decoder).forward).parameters else "past_key_values"
    prefix = decoder(input_ids=input_ids[:1, :shared], use_cache=True, **{cache_kwarg: cache}).last_hidden_state
    cache.batch_repeat_interleave(rows)  # the prefix's keys and values, once per row
    rest = decoder(input_ids=input_ids[:, shared:], use_cache=True, **{cache_kwarg: cache}).last_hidden_state
    return torch.cat([prefix.expand(rows, -1, -1), rest], dim=1)


def packed_hidden(model, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """:func:`decoder_hidden` of right-padded ``input_ids`` [B, T] whose rows hold ``lengths`` [B]
    real tokens, computed with the rows packed: first-fit into as few rows of width T as hold
    them, each sequence at positions counting from 0 again, which transformers turns into a
    block-causal mask (a token sees only its own sequence). Returns [B, T, H] in the input's
    layout (zeros at pads): the same as the padded batch at every real token, for the work of
    the real tokens (the copy warm-up's rows are a third padding). The layout is computed on the
    CPU; the tokens and hidden states stay on ``input_ids``' device."""
    rows, width = input_ids.shape
    device, lengths = input_ids.device, lengths.cpu()
    free: list[int] = []  # room left in each packed row
    start = torch.zeros(rows, dtype=torch.long)
    packed_row = torch.zeros(rows, dtype=torch.long)
    for i in torch.argsort(lengths, descending=True, stable=True).tolist():
        n = int(lengths[i])
        r = next((r for r, room in enumerate(free) if room >= n), len(free))
        if r == len(free):
            free.append(width)
        packed_row[i], start[i] = r, width - free[r]
        free[r] -= n
    column = torch.arange(width)
    real = column < lengths[:, None]  # [B, T]
    target = (packed_row[:, None] * width + start[:, None] + column)[real]  # flat packed index of each real token
    ids = input_ids.new_zeros(len(free) * width)
    ids[target.to(device)] = input_ids[real.to(device)]
    positions = column.repeat(len(free))  # pads continue the row's last sequence: they follow it, nothing sees them
    positions[target] = column.expand(rows, -1)[real]
    for r in range(len(free)):  # a row's tail after its last sequence counts on from it
        used = width - free[r]
        if 0 < used < width:
            positions[r * width + used:(r + 1) * width] = (positions[r * width + used - 1] + 1
                                                           + torch.arange(width - used))
    decoder = language_model(model).get_decoder()
    hidden = decoder(input_ids=ids.view(-1, width), position_ids=positions.to(device).view(-1, width),
                     use_cache=False).last_hidden_state
    out = hidden.new_zeros(rows, width, hidden.shape[-1])
    out[real.to(device)] = hidden.reshape(-1, hidden.shape[-1])[target.to(device)]
    return out


def lm_head(model, hidden: torch.Tensor) -> torch.Tensor:
    """Logits of ``hidden`` states (any leading shape): the LM's output embeddings. (For LMs whose
    head is exactly ``get_output_embeddings()``: Qwen, Llama, SmolLM, Mistral, GPT-2 …)"""
    return language_model(model).get_output_embeddings()(hidden)
