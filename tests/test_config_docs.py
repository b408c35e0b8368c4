"""The generated configuration reference: complete, and docs/configuration.md kept up to date."""

from pathlib import Path

import pytest

from aepo_rl.cli import main
from aepo_rl.config import Config, ConfigError, fields_info
from aepo_rl.config_docs import BEGIN, END, reference_markdown, render_page, write_page

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_configuration_page_is_up_to_date():
    text = PAGE.read_text(encoding="utf-8")
    assert render_page(text, PAGE) == text, (
        "docs/configuration.md is out of date with aepo_rl/config.py; "
        "run `python -m aepo_rl config docs --write docs/configuration.md`")


def test_reference_lists_every_key_with_default_range_and_presets():
    text = reference_markdown()
    for row in fields_info(Config()):
        assert f"| `{row.key}` |" in text, row.key
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `")}
    assert rows["| `rollout.n`"] == ("| `rollout.n` | `int` | `8` | ≥ 1 |  | "
                                     "Trajectories per prompt, n (§1; release: 12 or 16). |")
    assert "| [0, 1] |" in rows["| `task.arithmetic_fraction`"]
    assert "`full`, `surprisal`, `top10_proxy` | official: `top10_proxy` |" in rows["| `rollout.entropy_measure`"]
    assert "official: `aepo`" not in rows["| `algorithm.policy_loss`"]   # same as the default
    assert "ln\\|V\\|" in rows["| `rollout.entropy_reduce`"]             # a pipe cannot split the cell
    assert "`str \\| None`" in rows["| `model.path`"]


def test_write_page_replaces_only_the_generated_part(tmp_path):
    page = tmp_path / "configuration.md"
    page.write_text(f"# Intro kept\n\n{BEGIN}\nstale\n{END}\n\ntail kept\n")
    assert write_page(page) is True
    text = page.read_text()
    assert text.startswith("# Intro kept\n\n") and text.endswith(f"{END}\n\ntail kept\n")
    assert "stale" not in text and "| `rollout.n` |" in text
    assert write_page(page) is False


def test_a_stale_or_unmarked_page_is_detected(tmp_path):
    text = PAGE.read_text(encoding="utf-8")
    stale = text.replace("| `rollout.n` | `int` | `8` |", "| `rollout.n` | `int` | `12` |")
    assert render_page(stale, PAGE) != stale
    with pytest.raises(ConfigError, match="expected one line"):
        render_page("# no markers\n", tmp_path / "x.md")


def test_cli_prints_and_writes_the_reference(tmp_path, capsys):
    assert main(["config", "docs"]) == 0
    assert capsys.readouterr().out == reference_markdown()
    page = tmp_path / "c.md"
    page.write_text(f"{BEGIN}\n{END}\n")
    assert main(["config", "docs", "--write", str(page)]) == 0
    assert "updated" in capsys.readouterr().out and "| `eval.top_k` |" in page.read_text()
