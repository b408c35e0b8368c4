"""When does a sequence stop: EOS ids, stop strings that are single tokens (matched by id), and
stop strings spelled over several tokens (matched on the decoded tail of the new segment).

The tail is decoded only for rows whose new token can end a stop string (its text contains
the string's last character), so a step usually costs tensor ops only.
"""

from __future__ import annotations

import torch

REPLACEMENT_CHAR = "\ufffd"
"""What a token holding part of a multi-byte character decodes to on its own."""


def eos_token_ids(tokenizer, model) -> list[int]:
    """EOS ids of the tokenizer and of the model's generation config (an int or a list)."""
    ids = {tokenizer.eos_token_id}
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
    return sorted(i for i in ids if i is not None)


def single_token_id(tokenizer, text: str) -> int | None:
    """The id of ``text`` if the tokenizer spells it as exactly one token (e.g. an added tag)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


class StopMatcher:
    """Finds, per step, the rows that just generated EOS or completed a stop string."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: list[int], stops: tuple[str, ...],
                 device: torch.device):
        if any(not s for s in stops):
            raise ValueError(f"SamplingParams.stop must not contain an empty string, got {stops!r}")
        self.tokenizer = tokenizer
        self.stops = stops
        self.eos_ids = torch.tensor(eos_ids, dtype=torch.long, device=device)
        self.stop_of_id = {}
        for s in stops:
            token_id = single_token_id(tokenizer, s)
            if token_id is not None:
                self.stop_of_id[token_id] = s
        self.stop_ids = torch.tensor(sorted(self.stop_of_id), dtype=torch.long, device=device)
        self.end_ids = torch.cat([self.eos_ids, self.stop_ids])
        self.window = max((len(s.encode()) for s in stops), default=0) + 1
        self.may_complete = self._tokens_that_may_complete(vocab_size, device) if stops else None

    def _tokens_that_may_complete(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        """Bool [V]: the token's text holds a stop string's last character (or a partial byte)."""
        last_chars = {s[-1] for s in self.stops} | {REPLACEMENT_CHAR}
        n = min(vocab_size, len(self.tokenizer))
        texts = self.tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False)
        flags = [any(c in t for c in last_chars) for t in texts] + [False] * (vocab_size - n)
        flags = torch.tensor(flags, dtype=torch.bool, device=device)
        flags[self.stop_ids] = False  # those are matched by id
        return flags

    def ends(self, tokens: torch.Tensor, eos: bool = True) -> torch.Tensor:
        """Bool [B]: the token is EOS (unless ``eos`` is False) or a single-token stop string."""
        return torch.isin(tokens, self.end_ids if eos else self.stop_ids)

    def text_candidates(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """Bool [B]: rows whose new token could complete a multi-token stop string (None: no stops)."""
        return None if self.may_complete is None else self.may_complete[tokens]

    def stop_in_tail(self, segment_tail: list[int]) -> str | None:
        """The stop string that the decoded tail of the new segment now contains, if any."""
        text = self.tokenizer.decode(segment_tail[-self.window:], skip_special_tokens=False)
        return next((s for s in self.stops if s in text), None)
