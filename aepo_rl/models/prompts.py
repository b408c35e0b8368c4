"""Prompt encoding: a chat prompt's token ids, ending where the assistant's answer starts."""

from __future__ import annotations

from collections.abc import Mapping


def encode_prompt(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt, ending where the assistant's answer starts.

    Uses the tokenizer's chat template with the generation prompt. A tokenizer without a
    chat template gets a plain format: one ``"Role: content"`` paragraph per message, then
    ``"Assistant:"``.
    """
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        return [int(i) for i in ids]
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages) + "Assistant:"
    return list(tokenizer(text)["input_ids"])
