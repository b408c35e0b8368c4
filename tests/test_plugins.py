"""Registries and plugins: capabilities, `aepo --plugin`, the entry-point group, and every example
of docs/extending.md (examples/plugins/) run end to end through the config and the trainer."""

from __future__ import annotations

import importlib.metadata
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from fakes import FakeEngine
from helpers import build_tiny_model

from aepo_rl import registry
from aepo_rl.api import train_main
from aepo_rl.cli import main
from aepo_rl.config import ConfigError, load_config
from aepo_rl.engines import build_engine, check_entropy_measure
from aepo_rl.models import encode_prompt
from aepo_rl.registry import PluginError, Registry, UnknownNameError, load_plugin, load_plugins
from aepo_rl.rollout.tree import run_rollout
from aepo_rl.tasks import get_task
from aepo_rl.tools import get_tool, load_corpus
from aepo_rl.train.pipeline import check_rl_engine
from aepo_rl.train.rl import RLTrainer

PLUGINS = Path(__file__).resolve().parents[1] / "examples" / "plugins"
EXAMPLES = {"my_loss": ("POLICY_LOSSES", "unclipped"), "my_estimator": ("ADVANTAGE_ESTIMATORS", "batch_mean"),
            "my_tool": ("TOOLS", "wordcount"), "my_reward": ("REWARDS", "numeric_match"),
            "my_task": ("TASKS", "wordcount"), "my_engine": ("ENGINES", "counting_hf")}
TINY = {"rollout.n": 2, "trainer.batch_size": 2, "trainer.mini_batch_size": 1, "trainer.micro_batch_size": 1,
        "rollout.max_response_length": 24, "rollout.max_tokens_per_round": 8, "rollout.premonitor_probe_tokens": 4,
        "task.num_train": 4, "task.num_dev": 2, "task.num_test": 2, "trainer.lr": 1e-2}


@pytest.fixture
def plugins():
    """Every example plugin, loaded as `aepo --plugin <file>` loads it; afterwards each registry holds
    what it held before (another test module may have registered an entry of the same name)."""
    before = {}
    for registry_name, name in EXAMPLES.values():
        reg = getattr(registry, registry_name)
        reg.lookup(next(iter(reg)))  # loads the built-in entries first
        before[registry_name, name] = (reg._entries.get(name), reg._capabilities.get(name))
    modules = {path.stem: load_plugin(str(path)) for path in sorted(PLUGINS.glob("*.py"))}
    yield modules
    for (registry_name, name), (entry, capabilities) in before.items():
        reg = getattr(registry, registry_name)
        del reg[name]
        if entry is not None:
            reg._entries[name], reg._capabilities[name] = entry, capabilities


# ----------------------------------------------------------------------------------------------
# The registry


def test_entries_declare_known_capabilities_only():
    losses = Registry("policy loss", "aepo_rl.registry", vocabulary=("entropy", "entropy_stats"))
    with pytest.raises(TypeError, match=r"'mine': unknown capability \['binary'\]; a policy loss declares \['needs'\]"):
        losses.register("mine", binary=True)
    with pytest.raises(TypeError, match=r"may need a tuple of \['entropy', 'entropy_stats'\]"):
        losses.register("mine", needs=("entropy_stat",))
    with pytest.raises(TypeError, match="needs='entropy'"):
        losses.register("mine", needs="entropy")
    losses.register("mine", "also_mine", needs=["entropy"])(len)
    assert losses.lookup("also_mine") is len and losses.capabilities("mine") == {"needs": ("entropy",)}
    assert losses.needs("mine", "entropy") and not losses.needs("mine", "entropy_stats")
    assert list(losses) == ["also_mine", "mine"] and len(losses) == 2
    del losses["mine"]
    assert "mine" not in losses and "also_mine" in losses


def test_lookup_lists_the_valid_names_and_matches_patterns():
    tasks = registry.TASKS
    assert tasks.lookup("reasoning_gym:leg_counting") is tasks.lookup("reasoning_gym:<generator>")
    assert "reasoning_gym:anything" in tasks and "reasoning_gym" not in tasks and "imagenet" not in tasks
    with pytest.raises(UnknownNameError, match=r"unknown task 'imagenet'; valid names: .*reasoning_gym:<generator>"):
        tasks.lookup("imagenet")
    with pytest.raises(KeyError):  # a KeyError (get_tool, get_reward) and a ValueError (get_policy_loss) alike
        registry.TOOLS.lookup("browser")
    with pytest.raises(ValueError, match="unknown engine 'sglang'; valid names: hf, openai, vllm"):
        registry.ENGINES.lookup("sglang")


def test_built_in_entries_declare_what_the_trainer_reads():
    assert registry.POLICY_LOSSES.capabilities("aepo")["needs"] == ("entropy", "entropy_stats")
    assert [n for n in registry.POLICY_LOSSES if registry.POLICY_LOSSES.needs(n, "entropy_stats")] == ["aepo"]
    assert registry.ADVANTAGE_ESTIMATORS.needs("gigpo", "anchor_keys")
    assert [n for n in registry.ADVANTAGE_ESTIMATORS if registry.ADVANTAGE_ESTIMATORS.needs(n, "kl")] == \
        ["reinforce_plus_plus"]
    assert [n for n in registry.REWARDS if registry.REWARDS.capabilities(n)["binary"]] == \
        ["answer_list_em", "exact_match", "llm_judge", "math"]
    assert [n for n in registry.ENGINES if registry.ENGINES.capabilities(n)["shares_weights"]] == ["hf"]
    assert [n for n in registry.ENGINES if registry.ENGINES.capabilities(n)["syncs_weights"]] == ["vllm"]
    assert registry.ENGINES.capabilities("vllm")["entropies"] == ("surprisal", "top10_proxy")
    assert registry.ENGINES.capabilities("openai")["entropies"] == ("surprisal", "top10_proxy")
    assert registry.ENGINES.capabilities("hf")["entropies"] == ("full", "surprisal", "top10_proxy")


def test_an_entropy_measure_the_engine_cannot_give_is_refused_at_start(tmp_path):
    """§1.2: branching on another quantity than the configured one is refused, never substituted."""
    overrides = {"rollout.engine": "openai", "rollout.entropy_measure": "full"}
    with pytest.raises(ConfigError, match=r"rollout.entropy_measure='full' cannot be computed by "
                                          r"rollout.engine='openai'; it gives \['surprisal', 'top10_proxy'\]"):
        check_entropy_measure(load_config(overrides=overrides))
    check_entropy_measure(load_config(overrides={**overrides, "rollout.mode": "independent"}))  # no decisions
    check_entropy_measure(load_config(overrides={**overrides, "rollout.entropy_measure": "surprisal"}))

    @registry.register_engine("hf_without_full", shares_weights=True, entropies=("surprisal",))
    def hf_without_full(cfg, model, tokenizer):
        raise AssertionError("the check must come before any engine is built")

    try:
        cfg = load_config(overrides={"rollout.engine": "hf_without_full", "trainer.run_dir": str(tmp_path),
                                     "trainer.run_name": "refused"})
        with pytest.raises(ConfigError, match="it gives \\['surprisal'\\]"):
            train_main(cfg)
        assert not (tmp_path / "refused").exists()  # refused before the run folder or the task exist
    finally:
        del registry.ENGINES["hf_without_full"]


def test_the_rl_trainer_takes_an_engine_that_shares_or_syncs_the_weights():
    check_rl_engine(load_config(overrides={"rollout.engine": "vllm", "rollout.entropy_measure": "surprisal"}))
    with pytest.raises(ConfigError, match=r"shares the policy's weights or syncs them .* one of \['hf', 'vllm'\]"):
        check_rl_engine(load_config(overrides={"rollout.engine": "openai", "rollout.entropy_measure": "surprisal"}))
    with pytest.raises(ConfigError, match="rollout.entropy_measure='full' cannot be computed by rollout.engine='vllm'"):
        check_rl_engine(load_config(overrides={"rollout.engine": "vllm"}))


def test_config_choices_are_the_registered_names():
    for key, value in [("task.reward", "bleu"), ("rollout.engine", "sglang"), ("task.name", "imagenet"),
                       ("algorithm.adv_estimator", "gae")]:
        with pytest.raises(ConfigError, match=rf"{key}='{value}' is not allowed; choose one of \["):
            load_config(overrides={key: value})


def test_a_binary_reward_decides_correct_on_file_tasks(tmp_path):
    rows = tmp_path / "q.jsonl"
    rows.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")

    @registry.register_reward("always_one", binary=True)
    def always_one(response, answers, question=""):
        return 1.0

    try:
        task = get_task(load_config(overrides={"task.name": "file", "task.val_files": [str(rows)],
                                               "task.reward": "always_one"}))
        assert task.correct(task.examples("test")[0], "no answer at all")
    finally:
        del registry.REWARDS["always_one"]


# ----------------------------------------------------------------------------------------------
# Plugins


def test_a_plugin_that_fails_to_import_is_named_with_its_line(tmp_path, capsys):
    broken = tmp_path / "broken_loss.py"
    broken.write_text("import math\n\nraise RuntimeError('forgot a dependency')\n")
    with pytest.raises(PluginError, match=rf"plugin '{broken}' failed to import: RuntimeError: forgot a dependency "
                                          rf"\({broken}:3\)"):
        load_plugin(str(broken))
    assert main(["--plugin", str(broken), "config", "show"]) == 2
    assert f"aepo: plugin '{broken}' failed to import" in capsys.readouterr().err
    with pytest.raises(PluginError,
                       match="plugin 'no_such_pkg.loss' failed to import: ModuleNotFoundError.*PYTHONPATH"):
        load_plugin("no_such_pkg.loss")
    with pytest.raises(PluginError, match="FileNotFoundError: no such file"):
        load_plugin(str(tmp_path / "missing.py"))


def test_plugins_load_by_module_name_and_from_the_entry_point_group(tmp_path, monkeypatch):
    (tmp_path / "team_rewards.py").write_text(
        "from aepo_rl.registry import register_reward\n\n"
        "@register_reward('always_half')\ndef always_half(response, answers, question=''):\n    return 0.5\n")
    (tmp_path / "team_tools.py").write_text(
        "from aepo_rl.tools import register_tool\n\n"
        "@register_tool('echo')\nclass Echo:\n    name = tag = 'echo'\n    description = 'echo'\n"
        "    def run(self, arg):\n        return arg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    point = importlib.metadata.EntryPoint("team", "team_rewards", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry.importlib.metadata, "entry_points",
                        lambda group: [point] if group == registry.ENTRY_POINT_GROUP else [])
    try:
        assert main(["config", "show", "--yaml", "--plugin", "team_tools", "task.reward=always_half"]) == 0
        assert registry.TOOLS.lookup("echo")().run("hi") == "hi"
        assert [m.__name__ for m in load_plugins(entry_points=True)] == ["team_rewards"]
        assert load_plugins(entry_points=False) == []
    finally:
        del registry.REWARDS["always_half"], registry.TOOLS["echo"]
        del sys.modules["team_rewards"], sys.modules["team_tools"]


def test_a_plugin_corpus_is_searched_and_served_by_its_name(tmp_path):
    """docs/extending.md: a task's generated pages, registered with register_corpus, reach the search tool (and
    `aepo serve-search --corpus NAME`, which loads the same load_corpus) by name; the seed picks the world."""
    plugin = tmp_path / "team_world.py"
    plugin.write_text(
        "from aepo_rl.registry import register_corpus\n\n"
        "@register_corpus('team_world')\ndef team_world(seed):\n"
        "    return [{'id': f'p{i}', 'title': f'Person {seed}-{i}', 'text': f'born in town {seed * 10 + i}'}\n"
        "            for i in range(3)]\n")
    load_plugin(str(plugin))
    try:
        tool = get_tool("search", corpus="team_world", seed=2, cache_dir=tmp_path, topk=1)
        assert tool.run("town 21").startswith("Page 1: Person 2-1")
        assert [d["title"] for d in load_corpus("team_world", seed=1)] == ["Person 1-0", "Person 1-1", "Person 1-2"]
    finally:
        del registry.CORPORA["team_world"]
        sys.modules.pop("team_world", None)


def test_the_cli_accepts_plugins_before_and_after_the_subcommand(capsys):
    loss, estimator = str(PLUGINS / "my_loss.py"), str(PLUGINS / "my_estimator.py")
    try:
        assert main(["--plugin", loss, "config", "show", "--yaml", "--plugin", estimator,
                     "algorithm.policy_loss=unclipped", "algorithm.adv_estimator=batch_mean"]) == 0
        out = capsys.readouterr().out
        assert "policy_loss: unclipped" in out and "adv_estimator: batch_mean" in out
    finally:
        del registry.POLICY_LOSSES["unclipped"], registry.ADVANTAGE_ESTIMATORS["batch_mean"]
    assert main(["config", "show", "algorithm.policy_loss=unclipped"]) == 2  # without the plugin
    err = capsys.readouterr().err
    assert "algorithm.policy_loss='unclipped' is not allowed" in err and "aepo --plugin MODULE" in err


# ----------------------------------------------------------------------------------------------
# The examples of docs/extending.md


def test_every_example_registers_what_the_docs_say(plugins):
    assert set(plugins) == set(EXAMPLES)
    for registry_name, name in EXAMPLES.values():
        assert name in getattr(registry, registry_name)
    assert registry.REWARDS.capabilities("numeric_match")["binary"]
    assert registry.ENGINES.capabilities("counting_hf")["shares_weights"]
    docs = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    for stem, (_, name) in EXAMPLES.items():
        source = (PLUGINS / f"{stem}.py").read_text()
        assert source.strip() in docs, f"docs/extending.md does not show examples/plugins/{stem}.py in full"
        assert f"examples/plugins/{stem}.py" in docs and name in docs


def test_the_example_tool_task_and_reward_work_in_a_rollout(plugins, tiny_tokenizer):
    cfg = load_config(overrides={"task.name": "wordcount", "task.reward": "numeric_match", "task.num_train": 2})
    task = get_task(cfg)
    example = task.examples("train")[0]
    sentence, count = example.extra_info["sentence"], example.answers[0]

    def script(seq):  # call the tool on the sentence, then answer with its result
        return (f"<wordcount>{sentence}</wordcount>", 0.5) if seq.rounds == 0 else \
               (f" <answer>\\boxed{{{count}}}</answer>", 0.5)

    engine = FakeEngine(tiny_tokenizer, script)
    prompt = encode_prompt(tiny_tokenizer, example.messages)
    result = run_rollout(engine, [(example.id, prompt)], task.tools(), cfg.rollout, validation=True)
    response = result.groups[0][0].response_text
    assert f"<result>\n{count}\n</result>" in response  # the tool ran
    assert task.reward(example, response) == 1.0 and task.correct(example, response)
    assert task.reward(example, "<answer>\\boxed{99}</answer>") == 0.0
    assert task.demonstrations()[0].pieces[1] == (f" <result>\n{count}\n</result>", False)


def test_an_rl_step_with_every_example_plugin(plugins, tiny_tokenizer):
    cfg = load_config(overrides={**TINY, "algorithm.policy_loss": "unclipped", "algorithm.adv_estimator": "batch_mean",
                                 "task.name": "wordcount", "task.reward": "numeric_match",
                                 "rollout.engine": "counting_hf"})
    model = build_tiny_model(tiny_tokenizer, seed=1)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = RLTrainer(cfg, model, tiny_tokenizer, get_task(cfg), build_engine(cfg, model, tiny_tokenizer))
    assert trainer.policy_loss is plugins["my_loss"].unclipped_policy_loss
    assert trainer.advantage_estimator is plugins["my_estimator"].batch_mean_advantage
    assert isinstance(trainer.engine, plugins["my_engine"].CountingEngine)
    assert set(trainer.tools) == {"wordcount"}
    metrics = trainer.step()
    assert trainer.engine.calls > 0 and math.isfinite(metrics["actor/grad_norm"]) and "actor/pg_loss" in metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.slow
def test_aepo_train_runs_every_example_plugin(tmp_path):
    """`aepo --plugin ... train ...`: tiny model on the task's text, SFT on its demonstrations, RL, evaluation."""
    args = [arg for stem in EXAMPLES for arg in ("--plugin", str(PLUGINS / f"{stem}.py"))]
    overrides = {**TINY, "algorithm.policy_loss": "unclipped", "algorithm.adv_estimator": "batch_mean",
                 "task.name": "wordcount", "task.reward": "numeric_match", "rollout.engine": "counting_hf",
                 "model.tiny_init": "random", "model.tiny_hidden_size": 32, "model.tiny_num_layers": 1,
                 "model.tiny_intermediate_size": 64, "model.tiny_vocab_size": 400, "model.tiny_num_heads": 2,
                 "model.tiny_num_kv_heads": 1, "model.tiny_head_dim": 16, "model.tiny_copy_steps": 2, "sft.epochs": 1,
                 "sft.batch_size": 4, "trainer.steps": 1, "eval.samples": 1, "trainer.run_name": "plugins",
                 "trainer.run_dir": str(tmp_path / "runs"), "model.cache_dir": str(tmp_path / "cache")}
    try:
        assert main(args + ["train"] + [f"{key}={value}" for key, value in overrides.items()]) == 0
    finally:
        for registry_name, name in EXAMPLES.values():
            del getattr(registry, registry_name)[name]
    results = json.loads((tmp_path / "runs" / "plugins" / "eval.json").read_text())
    assert {"sft", "rl"} <= set(results)
