"""The PhantomWiki recipe: ``task.name=phantomwiki`` resolves to the task's defaults (TASK_DEFAULTS), which the
preset, a YAML file and the command line override, under every algorithm preset and ``aepo compare``; the
recipe's lengths hold the generated universes' pages and the teacher's demonstrations; its seed record's table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from aepo_rl.compare import preset_configs
from aepo_rl.config import PRESETS, TASK_DEFAULTS, Config, from_dict, load_config, set_key, to_dict

RECIPE = TASK_DEFAULTS["phantomwiki"]


def value(cfg: Config, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


def test_task_name_phantomwiki_resolves_to_the_recipe_and_synthetic_keeps_the_defaults():
    cfg, synthetic = load_config(overrides={"task.name": "phantomwiki"}), load_config()
    base = Config()
    for key, recipe_value in RECIPE.items():
        assert value(cfg, key) == recipe_value != value(base, key), key
        assert value(synthetic, key) == value(base, key), key
    assert from_dict(to_dict(cfg)) == cfg  # a run's config.yaml rebuilds the same config


def test_the_command_line_and_a_yaml_file_override_the_recipe(tmp_path):
    key = next(iter(RECIPE))
    cfg = load_config(overrides=["task.name=phantomwiki", f"{key}=77"])
    assert value(cfg, key) == 77
    section, name = key.split(".")
    path = tmp_path / "my.yaml"
    path.write_text(f"task:\n  name: phantomwiki\n{section}:\n  {name}: 55\n" if section != "task"
                    else f"task:\n  name: phantomwiki\n  {name}: 55\n")
    cfg = load_config(yaml_path=path)
    assert value(cfg, key) == 55
    assert all(value(cfg, k) == v for k, v in RECIPE.items() if k != key)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_keeps_its_algorithm_and_gets_the_recipe(preset):
    cfg = load_config(preset, overrides={"task.name": "phantomwiki"})
    assert all(value(cfg, k) == v for k, v in RECIPE.items())
    bare = load_config(preset)
    for key, preset_value in PRESETS[preset].items():
        assert value(cfg, key) == preset_value == value(bare, key)
    assert not set(RECIPE) & set(PRESETS[preset]), "a recipe key that a preset sets would clash in aepo compare"


def test_compare_arms_on_phantomwiki_run_the_recipe_with_their_own_algorithm():
    cfg = load_config(overrides={"task.name": "phantomwiki", "trainer.steps": 3})
    configs = preset_configs(cfg, ["grpo", "arpo", "aepo"], seeds=2, steps=None)
    assert len(configs) == 6
    for (arm, index), arm_cfg in configs.items():
        assert arm_cfg.task.name == "phantomwiki" and arm_cfg.trainer.steps == 3 and arm_cfg.trainer.seed == index
        assert all(value(arm_cfg, k) == v for k, v in RECIPE.items())
        assert arm_cfg.rollout.mode == {"grpo": "independent", "arpo": "arpo", "aepo": "aepo"}[arm]


def test_a_section_set_in_yaml_counts_as_set_for_each_of_its_keys(tmp_path):
    path = tmp_path / "lengths.yaml"
    path.write_text("task:\n  name: phantomwiki\nrollout:\n  max_response_length: 300\n")
    cfg = load_config(yaml_path=path)
    assert cfg.rollout.max_response_length == 300
    assert cfg.rollout.max_tool_response_tokens == RECIPE["rollout.max_tool_response_tokens"]
    set_key(cfg, "sft.max_length", 64)  # set_key on a built config is plain assignment
    assert cfg.sft.max_length == 64


# ---------------------------------------------------------------- the recipe's lengths on generated universes

from helpers import TINY_UNIVERSES, needs_generator  # noqa: E402


@needs_generator
def test_the_recipes_lengths_hold_the_pages_and_every_demonstration(tmp_path):
    """At the recipe's search_max_chars no page is cut; with the task's tokenizer nearly every page (2 of 255 in
    the default training universe, by at most 8 tokens: docs/tasks-and-rewards.md) fits the recipe's
    tool-result budget and every demonstration its SFT length (tiny universes)."""
    from aepo_rl.models import train_tiny_tokenizer
    from aepo_rl.tasks import get_task

    knobs = {k: v for k, v in TINY_UNIVERSES.items() if k != "task.search_max_chars"}
    cfg = load_config(overrides={**knobs, "model.cache_dir": str(tmp_path / "cache")})
    assert cfg.task.search_max_chars == RECIPE["task.search_max_chars"]
    task = get_task(cfg)
    pages = [page for split in ("train", "test") for page in task.corpus(split)]
    assert max(len(page["text"]) for page in pages) <= cfg.task.search_max_chars
    demos = task.demonstrations()
    assert demos and not any("…" in text for d in demos for text, trained in d.pieces if not trained)
    tokenizer = train_tiny_tokenizer(task.texts(), cfg.model.tiny_vocab_size)
    lengths = [len(tokenizer(f"Page 1: {p['title']} — {p['text']}")["input_ids"]) for p in pages]
    assert sum(n > cfg.rollout.max_tool_response_tokens for n in lengths) <= 0.05 * len(lengths)
    assert max(len(tokenizer("".join(t for t, _ in d.pieces))["input_ids"]) for d in demos) < cfg.sft.max_length


# ---------------------------------------------------------------- the seed record's table

sys.path.insert(0, str(Path(__file__).parent.parent / "lab" / "recorders"))


def test_the_seed_records_table_checks_each_target_and_gives_intervals_by_difficulty(tmp_path):
    import record_phantomwiki

    def split(em, f1, levels):
        return {"em": em, "pass@k": em, "f1": f1, "tool_calls": 2.0,
                "by_difficulty": {str(d): {"n": 10, "em": e, "f1": f} for d, (e, f) in levels.items()}}

    for seed, (sft, rl, train) in enumerate([(0.31, 0.45, 0.5), (0.25, 0.30, 0.5)]):
        entry = {"seed": seed, "commit": "abc1234", "wall_s": 900.0, "cpu_s": 500.0, "peak_rss_gb": 1.0,
                 "stages_s": {"task+model+SFT": 200.0}, "overrides": [],
                 "sft": split(sft, sft + 0.1, {1: (0.5, 0.6), 2: (0.2, 0.3)}),
                 "rl": split(rl, rl + 0.1, {1: (0.7, 0.8), 2: (0.3, 0.4)}), "rl_train_universe": split(train, 0.6, {})}
        (tmp_path / f"seed{seed}.json").write_text(json.dumps(entry))
        assert record_phantomwiki.checks(entry) == {"sft": seed == 0, "gain": seed == 0, "held_out": seed == 0}
    assert record_phantomwiki.main(["--out", str(tmp_path), "--table-only"]) == 0
    text = (tmp_path / "record.md").read_text()
    assert "SFT EM ≥ 0.3 NOT met" in text and "0.250 ✗" in text and "+0.050 ✗" in text and "(0.60×) ✗" in text
    row = next(line for line in text.splitlines() if line.startswith("| 1 (10) |"))
    assert row.startswith("| 1 (10) | 0.500 ± 0.000 | 0.600 ± 0.000 | 0.700 ± 0.000 | 0.800 ± 0.000")
