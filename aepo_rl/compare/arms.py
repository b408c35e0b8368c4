"""The arms of `aepo compare`: parsing ``--arm`` and ``--presets``, and one config per arm and seed index
(the common overrides, the shared rollout budget, the arm's own overrides, the seeding)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from aepo_rl.config import PRESETS, Config, ConfigError, load_config, parse_overrides, to_dict


@dataclasses.dataclass(frozen=True)
class Arm:
    """One compared algorithm: ``name`` (its rows and run folders ``<name>-seed<i>``), the ``preset`` it
    starts from, its own dotted ``overrides`` (applied to this arm only, after the common ones and the
    budget: ``rollout.n`` here makes a budget-matched arm) and its number of ``seeds``."""

    name: str
    preset: str
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    seeds: int = 1


ARM_NAME = re.compile(r"[A-Za-z0-9_.-]+")
SEEDING_KEYS = ("trainer.seed", "rollout.seed")


def parse_arm(text: str, seeds: int) -> Arm:
    """``"NAME=PRESET[:SEEDS] [KEY=VALUE ...]"`` (whitespace-separated) → :class:`Arm`; e.g.
    ``"arpo_random=arpo rollout.entropy_weight=0"`` or ``"grpo_n6=grpo:5 rollout.n=6"``."""
    head, *items = text.split() or [""]
    name, sep, preset = head.partition("=")
    usage = "give NAME=PRESET[:SEEDS] [KEY=VALUE ...], e.g. --arm 'arpo_random=arpo rollout.entropy_weight=0'"
    if not sep or not ARM_NAME.fullmatch(name) or name == "sft":
        raise ConfigError(f"--arm {text!r}: {usage} (NAME: letters, digits, _ . -; not 'sft')")
    preset, _, count = preset.partition(":")
    if preset not in PRESETS:
        raise ConfigError(f"--arm {text!r}: unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    try:
        runs = int(count) if count else seeds
    except ValueError:
        raise ConfigError(f"--arm {text!r}: '{count}' is not a number of seeds; {usage}") from None
    if runs < 1:
        raise ConfigError(f"--arm {text!r} asks for {runs} seeds; at least 1")
    overrides = parse_overrides(items)
    if seeding := [k for k in overrides if k in SEEDING_KEYS]:
        raise ConfigError(f"--arm {text!r} sets {', '.join(seeding)}: the seeds are the comparison's "
                          "(--seeds and the common trainer.seed / rollout.seed), the same for every arm")
    try:
        load_config(preset, overrides=overrides)
    except ConfigError as err:
        raise ConfigError(f"--arm {text!r}: {err}") from None
    return Arm(name, preset, overrides, runs)


def parse_presets(text: str, seeds: int) -> dict[str, int]:
    """``"grpo:5,arpo:5,dapo"`` → ``{"grpo": 5, "arpo": 5, "dapo": seeds}``: runs per preset, in order."""
    counts: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, count = item.partition(":")
        name = name.strip()
        if name not in PRESETS:
            raise ConfigError(f"unknown preset '{name}' in --presets; presets: {', '.join(PRESETS)}")
        if name in counts:
            raise ConfigError(f"preset '{name}' appears twice in --presets")
        try:
            counts[name] = int(count) if count else seeds
        except ValueError:
            raise ConfigError(f"--presets: '{item}' is not <preset> or <preset>:<seeds> (e.g. grpo:5)") from None
        if counts[name] < 1:
            raise ConfigError(f"--presets: '{item}' asks for {counts[name]} seeds; at least 1")
    if not counts:
        raise ConfigError("--presets is empty; e.g. --presets grpo,arpo,aepo")
    return counts


def as_arms(arms: list[Arm | str] | dict[str, int], seeds: int) -> list[Arm]:
    """Arms from :class:`Arm` objects, preset names (``seeds`` runs each) or ``{preset: runs}``; names unique."""
    if isinstance(arms, dict):
        arms = [Arm(name, name, {}, runs) for name, runs in arms.items()]
    out = [arm if isinstance(arm, Arm) else Arm(arm, arm, {}, seeds) for arm in arms]
    if not out:
        raise ConfigError("--presets is empty; e.g. --presets grpo,arpo,aepo")
    if min(arm.seeds for arm in out) < 1:
        raise ConfigError(f"--seeds must be >= 1, got {min(arm.seeds for arm in out)}")
    for arm in out:
        if arm.preset not in PRESETS:
            raise ConfigError(f"arm {arm.name}: unknown preset '{arm.preset}'; presets: {', '.join(PRESETS)}")
    names = [arm.name for arm in out]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"arm name(s) {', '.join(twice)} given twice (in --presets and/or --arm); names must differ")
    return out


def user_overrides(cfg: Config) -> dict[str, Any]:
    """The dotted keys where ``cfg`` differs from its bare preset (its YAML file and command-line overrides)."""
    base, mine = _flatten(to_dict(load_config(cfg.preset))), _flatten(to_dict(cfg))
    return {key: value for key, value in mine.items() if key != "preset" and base.get(key) != value}


def common_overrides(cfg: Config, arms: list[Arm]) -> dict[str, Any]:
    """The user's overrides (YAML file and command line), applied to every arm.

    An override of a key that some compared arm's preset sets would change that arm's algorithm, or
    apply to some arms and not to others: it is an error naming the arms, before anything runs (set it
    in an arm's own overrides instead). The budget and seeding keys are handled by :func:`arm_configs`.
    """
    overrides = user_overrides(cfg)
    clashes = {key: [arm.name for arm in arms if key in PRESETS[arm.preset]] for key in overrides}
    if clashes := {key: names for key, names in clashes.items() if names}:
        listed = "; ".join(f"{key} (set by the preset of {', '.join(names)})" for key, names in clashes.items())
        raise ConfigError(f"compare: the common override(s) {listed} would change what an arm's preset sets. Give "
                          "them to the arms that should differ, e.g. --arm 'NAME=PRESET KEY=VALUE', or compare "
                          "presets that leave them alone")
    return overrides


def arm_configs(cfg: Config, arms: list[Arm], steps: int | None) -> dict[tuple[str, int], Config]:
    """One config per (arm name, seed index): preset, common overrides, budget, the arm's overrides, seeding.

    Seed index i sets ``trainer.seed`` and ``rollout.seed`` to the user's value + i for every arm, so runs
    with the same index see the same data order; the rollout budget (``rollout.n``,
    ``trainer.batch_size``, ``trainer.steps``) is the user's unless the arm sets its own.
    """
    arms = as_arms(arms, 1)
    common = common_overrides(cfg, arms)
    budget = {"rollout.n": cfg.rollout.n, "trainer.batch_size": cfg.trainer.batch_size,
              "trainer.steps": cfg.trainer.steps if steps is None else steps}
    configs = {}
    for arm in arms:
        for index in range(arm.seeds):
            seeding = {"trainer.seed": cfg.trainer.seed + index, "rollout.seed": cfg.rollout.seed + index}
            try:
                configs[(arm.name, index)] = load_config(arm.preset, overrides={**common, **budget, **arm.overrides,
                                                                                **seeding})
            except ConfigError as err:
                raise ConfigError(f"arm {arm.name} (preset {arm.preset} with the common and its own overrides): "
                                  f"{err}") from None
    return configs


def preset_configs(cfg: Config, presets: list[str] | dict[str, int], seeds: int,
                   steps: int | None) -> dict[tuple[str, int], Config]:
    """:func:`arm_configs` of arms named after their presets (a list, ``seeds`` runs each, or ``{preset: runs}``)."""
    return arm_configs(cfg, as_arms(presets, seeds), steps)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
