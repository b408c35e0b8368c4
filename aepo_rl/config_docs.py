"""The configuration reference in Markdown, generated from the config dataclasses.

``docs/configuration.md`` keeps a hand-written introduction (presets, YAML, overrides) and, between
two marker lines, the reference this module renders from :func:`aepo_rl.config.fields_info`: one
table per section with every key's type, default, allowed values, the presets that change it and
its documentation. ``aepo config docs`` prints the reference; ``aepo config docs --write
docs/configuration.md`` replaces the part between the markers, and a test fails when the page is
out of date.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from aepo_rl.config import PRESETS, Config, ConfigError, FieldInfo, fields_info

BEGIN = "<!-- BEGIN GENERATED: aepo config docs --write docs/configuration.md -->"
END = "<!-- END GENERATED -->"


def _value(value: Any) -> str:
    """A value as it is written in YAML or on the command line, in backticks."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return f"`{text.removesuffix('...').strip()}`"


def _cell(text: str) -> str:
    """A table cell: pipes escaped, and angle brackets outside code spans (``<gen>``) shown as text."""
    pieces = text.replace("|", "\\|").replace("\n", " ").split("`")
    pieces[::2] = [piece.replace("<", "&lt;").replace(">", "&gt;") for piece in pieces[::2]]
    return "`".join(pieces).replace("lab/notebook.md", "[notebook](../lab/notebook.md)")


def _allowed(row: FieldInfo) -> str:
    if row.choices:
        return ", ".join(f"`{choice}`" for choice in row.choices)
    low = f"[{row.ge:g}" if row.ge is not None else f"({row.gt:g}" if row.gt is not None else None
    if low and row.le is not None:
        return f"{low}, {row.le:g}]"
    if low:
        return f"≥ {row.ge:g}" if row.ge is not None else f"> {row.gt:g}"
    return f"≤ {row.le:g}" if row.le is not None else ""


def _preset_values(row: FieldInfo) -> str:
    """The presets that set this key to another value than its default, with that value."""
    return ", ".join(f"{name}: {_value(overrides[row.key])}" for name, overrides in PRESETS.items()
                     if row.key in overrides and overrides[row.key] != row.value)


def presets_table() -> str:
    """Every preset with the overrides it applies on top of the defaults (the ``aepo`` preset)."""
    lines = ["| preset | overrides on top of the defaults |", "|---|---|"]
    for name, overrides in PRESETS.items():
        text = ", ".join(f"`{key}={_value(value)[1:-1]}`" for key, value in overrides.items())
        lines.append(f"| `{name}` | {text or '— (the defaults)'} |")
    return "\n".join(lines)


def reference_markdown() -> str:
    """The generated reference: the presets, then one table per config section."""
    cfg = Config()
    rows = fields_info(cfg)
    sections = [("top level", "Keys outside the sections.", [row for row in rows if "." not in row.key])]
    sections += [(f.name, f.metadata["doc"], [row for row in rows if row.key.startswith(f"{f.name}.")])
                 for f in dataclasses.fields(cfg) if dataclasses.is_dataclass(getattr(cfg, f.name))]
    parts = ["## Presets (generated)", "", presets_table(), ""]
    for name, doc, section_rows in sections:
        parts += [f"## {name}", "", doc, "",
                  "| key | type | default | allowed | presets | meaning |", "|---|---|---|---|---|---|"]
        for row in section_rows:
            cells = (f"`{row.key}`", f"`{row.type}`", _value(row.value), _allowed(row),
                     _preset_values(row), row.doc)
            parts.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
        parts.append("")
    return "\n".join(parts)


def _split(text: str, path: Path) -> tuple[str, str]:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ConfigError(f"{path}: expected one line '{BEGIN}' followed by one line '{END}'")
    head, rest = text.split(BEGIN)
    return head, rest.split(END)[1]


def render_page(text: str, path: Path) -> str:
    """``text`` (a page with the two markers) with the generated reference between them."""
    head, tail = _split(text, path)
    return f"{head}{BEGIN}\n\n{reference_markdown()}\n{END}{tail}"


def write_page(path: str | Path) -> bool:
    """Regenerate the reference inside ``path``; return whether the file changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    new = render_page(text, path)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text
