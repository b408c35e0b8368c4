"""Reading JSON Lines files (metrics, datasets, corpora): one JSON object per line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from aepo_rl.errors import UserError


class JsonlError(UserError, ValueError):
    """A line of a JSONL file is not a JSON object; the message starts with ``file:line``."""

    def __init__(self, location: str, problem: str):
        super().__init__(f"{location}: {problem}")
        self.location, self.problem = location, problem


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of ``path`` (numbers start at 1).

    Raises :class:`JsonlError` naming ``path:line`` on a line that is not valid JSON or not an object.
    """
    with Path(path).open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise JsonlError(f"{path}:{line_no}", f"not valid JSON ({err.msg})") from None
            if not isinstance(obj, dict):
                raise JsonlError(f"{path}:{line_no}", f"expected a JSON object, got {type(obj).__name__}")
            yield line_no, obj
