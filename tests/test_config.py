"""Config system: presets, YAML round-trip, dotted overrides, error messages."""

import dataclasses

import pytest

from aepo_rl.cli import main
from aepo_rl.config import PRESETS, Config, ConfigError, from_dict, load_config, parse_overrides, to_dict, to_yaml


def test_every_field_is_documented():
    cfg = Config()
    for section in dataclasses.fields(cfg):
        assert section.metadata.get("doc"), section.name
        obj = getattr(cfg, section.name)
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                assert f.metadata.get("doc"), f"{section.name}.{f.name} has no documentation"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_yaml_round_trip(preset, tmp_path):
    cfg = load_config(preset, overrides=["rollout.n=6", "task.train_files=[a.jsonl,b.jsonl]"])
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    again = load_config(preset, path)
    assert to_dict(again) == to_dict(cfg)
    assert to_dict(from_dict(to_dict(cfg))) == to_dict(cfg)


def test_yaml_preset_key_selects_the_preset(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("preset: grpo\nrollout:\n  n: 5\n")
    cfg = load_config("aepo", path)
    assert cfg.preset == "grpo" and cfg.rollout.mode == "independent" and cfg.rollout.n == 5


def test_overrides_are_typed():
    cfg = load_config("aepo", overrides=["algorithm.clip_ratio_high=0.28", "rollout.n=8",
                                         "rollout.restarts=false", "rollout.global_samples=null",
                                         "model.lora_target_modules=[q_proj,v_proj]"])
    assert cfg.algorithm.clip_ratio_high == 0.28 and isinstance(cfg.algorithm.clip_ratio_high, float)
    assert cfg.rollout.n == 8 and cfg.rollout.restarts is False and cfg.rollout.global_samples is None
    assert cfg.model.lora_target_modules == ["q_proj", "v_proj"]
    assert parse_overrides(["a.b=1", "c.d=x y"]) == {"a.b": 1, "c.d": "x y"}


def test_presets_set_what_they_claim():
    assert load_config("official").rollout.penalty_scope == "prompt_round"
    assert load_config("official").algorithm.entropy_adv_coef == 0.0
    assert load_config("aepo").rollout.penalty_scope == "path"
    assert load_config("aepo").algorithm.entropy_adv_coef == 0.2
    assert load_config("dapo").algorithm.clip_ratio_high == 0.28
    assert load_config("grpo").rollout.mode == "independent"
    assert load_config("arpo").rollout.mode == "arpo"


def test_unknown_key_names_closest():
    with pytest.raises(ConfigError, match=r"unknown config key 'algorithm.clip_ratio_hgh'.*algorithm.clip_ratio_high"):
        load_config("aepo", overrides=["algorithm.clip_ratio_hgh=0.3"])
    with pytest.raises(ConfigError, match=r"unknown config key 'rollut.n'.*'rollout'"):
        load_config("aepo", overrides=["rollut.n=3"])


def test_unknown_preset_names_closest():
    with pytest.raises(ConfigError, match=r"unknown preset 'offical'.*'official'"):
        load_config("offical")


@pytest.mark.parametrize("override, message", [
    ("algorithm.clip_ratio_low=-0.1", r"algorithm.clip_ratio_low=-0.1 is out of range: it must be >= 0"),
    ("rollout.n=0", r"rollout.n=0 is out of range: it must be >= 1"),
    ("rollout.mode=beam", r"rollout.mode='beam' is not allowed; choose one of \['aepo', 'arpo', 'independent'\]"),
    ("rollout.n=abc", r"rollout.n: expected an integer"),
    ("rollout.n=2.5", r"rollout.n: expected an integer"),
    ("rollout.restarts=maybe", r"rollout.restarts: expected true or false"),
    ("algorithm.clip_ratio_c=1.0", r"algorithm.clip_ratio_c=1.0 is out of range: it must be > 1"),
    ("rollout.global_samples=20", r"rollout.global_samples=20 must be <= rollout.n=8"),
])
def test_bad_values_name_field_and_range(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("aepo", overrides=[override])


def test_bad_yaml_names_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config("aepo", path)


def test_cli_config_show(capsys):
    assert main(["config", "show", "--preset", "official", "--yaml", "rollout.n=12"]) == 0
    out = capsys.readouterr().out
    assert "preset: official" in out and "n: 12" in out and "penalty_scope: prompt_round" in out
    assert main(["config", "show", "rollout.nn=3"]) == 2
    assert "did you mean 'rollout.n'" in capsys.readouterr().err


def test_the_example_configs_load_and_set_what_they_say():
    from pathlib import Path

    examples = sorted((Path(__file__).parent.parent / "examples").rglob("*.yaml"))
    assert examples, "no example configs found"
    for path in examples:
        load_config(yaml_path=path)  # an unknown key or a bad value raises ConfigError naming it
    cfg = load_config(yaml_path=Path(__file__).parent.parent / "examples" / "smollm2" / "aepo.yaml")
    assert (cfg.model.path, cfg.rollout.tool_format, cfg.sft.epochs) == ("smollm2", "xml", 2)


def test_vllm_compilation_config_is_a_mapping_passed_to_vllm(tiny_model, tiny_tokenizer, monkeypatch):
    """The command-line spelling reaches ``vllm.LLM(compilation_config=...)`` as a dict (a stand-in vllm here)."""
    import types

    from aepo_rl.config import vllm_compilation_config
    from aepo_rl.engines import build_engine
    from aepo_rl.engines import vllm as vllm_engine

    cfg = load_config(overrides=["rollout.engine=vllm", "rollout.entropy_measure=surprisal",
                                 "rollout.vllm_compilation_config={mode: 0, cudagraph_mode: FULL_DECODE_ONLY, "
                                 "cudagraph_capture_sizes: [1, 2, 4]}"])
    expected = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}
    assert vllm_compilation_config(cfg.rollout) == expected
    seen = {}

    class LLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(get_vocab_size=lambda: 7))

    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: types.SimpleNamespace(LLM=LLM))
    build_engine(cfg, tiny_model, tiny_tokenizer)
    assert seen["compilation_config"] == expected
    seen.clear()
    build_engine(load_config(overrides=["rollout.engine=vllm", "rollout.entropy_measure=surprisal"]), tiny_model,
                 tiny_tokenizer)
    assert seen and "compilation_config" not in seen  # vLLM's default
    with pytest.raises(ConfigError, match="rollout.vllm_compilation_config='FULL' must be a mapping"):
        load_config(overrides=["rollout.vllm_compilation_config=FULL"])


@pytest.mark.parametrize("key, hint", [
    ("steps", "did you mean 'trainer.steps'?"),  # a bare key of one section: that key, not the section 'sft'
    ("tiny_hidden_size", "did you mean 'model.tiny_hidden_size'?"),
    ("epochs", "did you mean 'sft.epochs'?"),
    ("lr", "did you mean 'sft.lr' or 'trainer.lr'?"),  # bare keys of several sections: each
    ("stpes", "did you mean 'trainer.steps'?"),
    ("modle", "did you mean 'model'?"),
])
def test_a_bare_key_suggests_the_dotted_key(key, hint):
    with pytest.raises(ConfigError) as err:
        load_config(overrides={key: 10})
    assert str(err.value) == f"unknown config key '{key}'; {hint}"


@pytest.mark.parametrize("width", [128, 192, 256, 384, 512])
def test_a_wider_tiny_model_is_one_knob(width):
    assert load_config(overrides={"model.tiny_hidden_size": width}).model.tiny_hidden_size == width


@pytest.mark.parametrize("overrides, keys", [
    ({"model.tiny_hidden_size": 768}, r"model.tiny_hidden_size=768 with model.tiny_head_dim=64 needs 6 key/value heads"
     r".*model.tiny_num_kv_heads=4: set model.tiny_num_heads=6 model.tiny_num_kv_heads=6, or model.tiny_head_dim=96, "
     r"or model.tiny_init=random"),
    ({"model.tiny_hidden_size": 256, "model.tiny_num_kv_heads": 1}, r"needs 2 key/value heads"),
    ({"model.tiny_head_dim": 16}, r"model.tiny_head_dim >= 30.*got 16.*model.tiny_init=random"),
    ({"model.tiny_num_layers": 1}, r"model.tiny_num_layers=1: set model.tiny_num_layers=2, or model.tiny_init=random"),
    ({"model.tiny_num_heads": 4, "model.tiny_num_kv_heads": 3}, r"model.tiny_num_heads=4 must be a multiple of "
     r"model.tiny_num_kv_heads=3"),
])
def test_a_tiny_shape_without_room_for_the_induction_circuit_names_the_keys(overrides, keys):
    with pytest.raises(ConfigError, match=keys):
        load_config(overrides=overrides)


def test_shapes_the_circuit_does_not_need_are_fine_with_a_random_start_or_another_model():
    random_start = {"model.tiny_init": "random", "model.tiny_head_dim": 16, "model.tiny_num_layers": 1}
    assert load_config(overrides=random_start).model.tiny_head_dim == 16
    assert load_config(overrides={"model.path": "smollm2", "model.tiny_head_dim": 16}).model.tiny_head_dim == 16
