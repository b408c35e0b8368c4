"""The optional parts a first `aepo train` does not need are extras, and a missing one is named with its install
line before any work (docs/architecture.md, Contracts): TensorBoard, the search server, the math reward,
parquet files."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from aepo_rl.cli import main
from aepo_rl.errors import MissingExtraError, import_extra
from aepo_rl.rewards import get_reward
from aepo_rl.tasks.loaders import read_rows
from aepo_rl.train.logger import RunLogger

ROOT = Path(__file__).parents[1]
EXTRAS = {"tensorboard": ["tensorboard"], "server": ["fastapi", "uvicorn"], "math": ["math-verify"],
          "parquet": ["pyarrow"]}


def test_the_heavy_parts_are_extras_that_dev_installs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    for extra, packages in EXTRAS.items():
        assert all(package in " ".join(project["optional-dependencies"][extra]) for package in packages)
        assert not any(package in core for package in packages), extra
        assert extra in project["optional-dependencies"]["dev"][0]


def hide(monkeypatch, *modules):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError


def test_import_extra_names_the_extra(monkeypatch):
    hide(monkeypatch, "pyarrow", "pyarrow.parquet")
    with pytest.raises(MissingExtraError, match=r"reading x needs pyarrow: pip install -e '\.\[parquet\]'"):
        import_extra("pyarrow.parquet", "parquet", "reading x")
    assert import_extra("json", "none", "json") is json


def test_a_parquet_file_without_pyarrow_names_the_file_and_the_extra(monkeypatch, tmp_path):
    data = tmp_path / "train.parquet"
    data.write_bytes(b"PAR1")
    hide(monkeypatch, "pyarrow", "pyarrow.parquet")
    with pytest.raises(MissingExtraError, match=rf"reading {data} needs pyarrow: .*\[parquet\]"):
        read_rows(data)


def test_the_math_reward_without_math_verify_is_refused_when_looked_up(monkeypatch):
    assert get_reward("math")  # installed by [dev]
    hide(monkeypatch, "math_verify")
    with pytest.raises(MissingExtraError, match=r"reward 'math' needs math_verify: .*\[math\]"):
        get_reward("math")
    assert get_reward("exact_match")  # the others need nothing


def test_serve_search_without_fastapi_exits_2_naming_the_extra(monkeypatch, capsys):
    hide(monkeypatch, "fastapi")
    assert main(["serve-search", "--corpus", "synthetic"]) == 2
    assert "aepo serve-search needs fastapi: pip install -e '.[server]'" in capsys.readouterr().err


def test_a_run_without_tensorboard_says_so_and_goes_on(monkeypatch, tmp_path):
    hide(monkeypatch, "torch.utils.tensorboard")
    with RunLogger(tmp_path, total_steps=1, history=[], tensorboard=True) as logger:
        logger.log(1, {"actor/pg_loss": 0.5})
    assert not (tmp_path / "tensorboard").exists()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["actor/pg_loss"] == 0.5


def test_every_test_module_collects_without_the_extras():
    """.ci/run's vLLM and verl venvs install the core alone and collect every test module before `-m vllm` or
    `-m verl` selects: a module that imports an extra (or a [dev]-only package) at its top stops their run."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dev = [*extras["dev"][1:], *(p for name in EXTRAS for p in extras[name])]
    modules = sorted({re.split(r"[<>=\[ ]", p)[0].replace("-", "_") for p in dev} - {"pytest", "ruff"})
    assert {"pyarrow", "fastapi", "uvicorn", "tensorboard", "math_verify", "trl", "datasets"} <= set(modules)
    code = (f"import sys\nfor m in {modules!r}: sys.modules[m] = None\nimport pytest\n"
            "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'tests']))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"hidden {modules}:\n{result.stdout[-4000:]}"
