"""The CLI's one error path: every user mistake exits with status 2 and one line naming the file,
line or key at fault, without a traceback; --debug shows it. Also --version, help texts, and a
`config show` that does not import torch. No test here trains: each error comes before long work."""

from __future__ import annotations

import errno
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aepo_rl import __version__, cli, errors, registry
from aepo_rl.cli import build_parser, main, report_error

ROOT = Path(__file__).resolve().parents[1]


def run_main(capsys, *argv: str) -> tuple[int, str]:
    """``aepo argv`` in this process: (exit status, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def run_aepo(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aepo_rl", *map(str, argv)], cwd=ROOT, capture_output=True,
                          check=False,
                          text=True, timeout=120, env={**os.environ, **env})


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def eval_file(path: Path) -> list[str]:
    return ["eval", "--task", "file", f"task.val_files=[{path}]"]


# ---------------------------------------------------------------- files and folders

def test_a_missing_config_file_is_named(capsys, tmp_path):
    code, err = run_main(capsys, "train", "--config", tmp_path / "nope.yaml")
    assert code == 2 and f"--config {tmp_path / 'nope.yaml'}: no such file" in err


def test_resume_of_a_missing_run_names_the_folder(capsys, tmp_path):
    code, err = run_main(capsys, "train", "--resume", tmp_path / "no_run")
    assert code == 2 and f"--resume {tmp_path / 'no_run'}: no config.yaml there" in err


def test_an_unwritable_run_folder_fails_before_the_run(capsys, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code, err = run_main(capsys, "train", f"trainer.run_dir={blocker / 'runs'}")
    assert code == 2 and f"trainer.run_dir={blocker / 'runs'}: {blocker} is a file, not a folder" in err

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if os.geteuid() == 0:  # root may write anywhere: report the folder as a normal user would find it
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else access(p, mode))
    code, err = run_main(capsys, "train", f"trainer.run_dir={locked / 'runs'}")
    assert code == 2 and f"cannot write {locked}: permission denied" in err


def test_eval_out_is_checked_before_evaluating(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("aepo_rl.evaluate.get_task", lambda cfg: pytest.fail("evaluated"))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code, err = run_main(capsys, "eval", "--out", blocker / "results.json")
    assert code == 2 and f"--out={blocker / 'results.json'}: {blocker} is a file" in err


# ---------------------------------------------------------------- data rows

def test_a_malformed_jsonl_line_names_file_and_line(capsys, tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", ['{"question": "q", "answer": "a"}', "{bad json"])
    code, err = run_main(capsys, *eval_file(path))
    assert code == 2 and f"{path}:2: not valid JSON" in err


def test_a_row_with_a_missing_field_names_file_line_and_field(capsys, tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", ['{"question": "q", "answer": "a"}', "", '{"question": "q"}'])
    code, err = run_main(capsys, *eval_file(path))
    assert code == 2 and f"{path}:3: missing field 'answer'" in err  # lines counted from 1, as editors do


def test_an_empty_data_file_is_named(capsys, tmp_path):
    path = write_lines(tmp_path / "empty.jsonl", [])
    code, err = run_main(capsys, *eval_file(path))
    assert code == 2 and f"data file {path} has no rows" in err


# ---------------------------------------------------------------- models and endpoints

def test_a_missing_model_folder_is_named(capsys, tmp_path):
    code, err = run_main(capsys, "eval", "--model", tmp_path / "no_model")
    assert code == 2 and f"model.path='{tmp_path / 'no_model'}': no such folder" in err


def test_a_hub_id_says_how_to_download_it(capsys):
    code, err = run_main(capsys, "eval", "--model", "Qwen/Qwen3-0.6B")
    assert code == 2 and "hf download Qwen/Qwen3-0.6B --local-dir" in err


def test_a_mistyped_local_model_path_is_a_missing_folder_not_a_hub_id(capsys, tmp_path, monkeypatch):
    (tmp_path / "models" / "Qwen3-0.6B").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    code, err = run_main(capsys, "eval", "--model", "models/qwen3-0.6b")
    assert code == 2 and "model.path='models/qwen3-0.6b': no such folder" in err
    assert "did you mean 'models/Qwen3-0.6B'?" in err and "hf download" not in err


def test_a_truncated_weights_file_is_named(capsys, tmp_path, tiny_model, tiny_tokenizer):
    folder = tmp_path / "model"
    tiny_model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as stream:
        stream.truncate(weights.stat().st_size // 2)
    code, err = run_main(capsys, "eval", "--model", folder, "eval.num_questions=1")
    assert code == 2 and f"{weights}: the weights file is truncated or damaged" in err


def test_a_truncated_trainer_state_is_named(tmp_path):
    from aepo_rl.train.checkpoint import load_trainer_state

    step = tmp_path / "step_000003"
    step.mkdir()
    (step / "trainer_state.pt").write_bytes(b"PK\x03\x04 cut")
    with pytest.raises(errors.UserError,
                       match=f"{step / 'trainer_state.pt'}: the checkpoint's trainer state is truncated"):
        load_trainer_state(step)


@pytest.mark.parametrize("command", ["sft", "train"])
def test_data_without_demonstrations_fails_before_any_model_is_built(capsys, tmp_path, monkeypatch, command):
    monkeypatch.setattr("aepo_rl.train.sft.load_policy", lambda *a, **k: pytest.fail("a model was built"))
    monkeypatch.setattr("aepo_rl.train.pipeline.load_policy", lambda *a, **k: pytest.fail("a model was built"))
    rows = write_lines(tmp_path / "rows.jsonl", ['{"question": "q", "answer": "a"}'])
    code, err = run_main(capsys, command, "task.name=file",
                         f"task.train_files=[{rows}]", f"task.val_files=[{rows}]", f"trainer.run_dir={tmp_path}",
                         *(["--out", tmp_path / "sft"] if command == "sft" else []))
    assert code == 2 and "task 'file' has no demonstrations for cold-start SFT" in err and "sft.epochs=0" in err
    assert "internal error" not in err


def test_a_model_folder_without_tokenizer_says_so(capsys, tmp_path, tiny_model):
    tiny_model.save_pretrained(tmp_path / "model")
    code, err = run_main(capsys, "eval", "--model", tmp_path / "model")
    assert code == 2 and f"{tmp_path / 'model'} has no tokenizer" in err and "max_prompt_length" not in err


def test_a_down_endpoint_names_its_url(capsys, tmp_path, tiny_tokenizer):
    tiny_tokenizer.save_pretrained(tmp_path / "tokenizer")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, err = run_main(capsys, "eval", "--model", tmp_path / "tokenizer", "--endpoint", f"http://127.0.0.1:{port}/v1",
                         "--endpoint-model", "m", "eval.num_questions=1", "eval.samples=1")
    assert code == 2 and f"server at http://127.0.0.1:{port}/v1/completions is unreachable" in err


# ---------------------------------------------------------------- arguments, disk, internal errors

def test_num_prompts_0_is_refused_by_the_parser(capsys):
    code, err = run_main(capsys, "rollout", "--num-prompts", "0")
    assert code == 2 and "argument --num-prompts: must be >= 1, got 0" in err


def test_a_full_disk_is_named(tmp_path, capsys):
    assert report_error(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.pt"))) == 2
    assert capsys.readouterr().err.startswith(f"aepo: disk full writing {tmp_path / 'x.pt'} (No space left on device)")
    assert report_error(OSError(errno.ENOSPC, "No space left on device")) == 2  # a write through a file object
    assert capsys.readouterr().err.startswith("aepo: disk full (No space left on device): free some space")


def test_a_checkpoint_save_on_a_full_disk_is_named_not_torch_s_message(tmp_path, capsys, monkeypatch,
                                                                     tiny_model, tiny_tokenizer):
    # torch reports a full disk in its own words; with no space left on that disk it becomes ENOSPC
    from aepo_rl.train import checkpoint

    def torch_save_on_a_full_disk(obj, path):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing "
                           "file data/0: file write failed")

    monkeypatch.setattr(checkpoint.torch, "save", torch_save_on_a_full_disk)
    monkeypatch.setattr(errors.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 0))
    with pytest.raises(OSError) as caught:
        checkpoint.save_checkpoint(tmp_path, 3, tiny_model, tiny_tokenizer, {}, keep=2)
    assert caught.value.errno == errno.ENOSPC and not list(tmp_path.iterdir())  # the partial checkpoint is gone
    assert report_error(caught.value) == 2
    assert capsys.readouterr().err.startswith(f"aepo: disk full writing {tmp_path / 'step_000003'}")
    # with space left, the same failure is not a full disk: it passes through unchanged
    monkeypatch.setattr(errors.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 0, 10**9))
    with pytest.raises(RuntimeError, match="PytorchStreamWriter"):
        checkpoint.save_checkpoint(tmp_path, 3, tiny_model, tiny_tokenizer, {}, keep=2)


def test_an_internal_error_is_one_line_that_points_at_debug(capsys, monkeypatch):
    monkeypatch.setattr(cli, "cmd_config", lambda args: {}["bug"])
    code, err = run_main(capsys, "config", "show")
    assert code == 1 and "aepo: internal error: KeyError: 'bug'" in err and "--debug" in err


def test_debug_shows_the_traceback():
    for argv, env in ((["--debug", "config", "show", "rollout.n=0"], {}),
                      (["config", "show", "rollout.n=0", "--debug"], {}),
                      (["config", "show", "rollout.n=0"], {"AEPO_DEBUG": "1"})):
        done = run_aepo(*argv, **env)
        assert done.returncode != 0 and "Traceback" in done.stderr and "rollout.n=0 is out of range" in done.stderr
    done = run_aepo("config", "show", "rollout.n=0")
    assert done.returncode == 2
    assert done.stderr.strip() == "aepo: config error: rollout.n=0 is out of range: it must be >= 1"


# ---------------------------------------------------------------- --version, help, config show

def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"aepo {__version__}"


def test_every_option_has_a_help_text():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict)).choices
    assert commands
    for name, command in [("aepo", parser), *commands.items()]:
        for action in command._actions:
            if action.dest != "command":
                assert action.help, f"{name} {'/'.join(action.option_strings) or action.dest} has no help text"


def heavy_imports_of(lines: str) -> tuple[list[str], str]:
    """Run ``lines`` (after ``from aepo_rl.cli import main``) in a fresh interpreter: the torch and transformers
    modules it imported, and its stderr."""
    script = (f"import sys, contextlib, io\nfrom aepo_rl.cli import main\n{lines}\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"')), done.stderr


@pytest.mark.parametrize("argv", [["train"], ["train", "--resume", "runs/none"], ["sft"], ["eval"], ["rollout"],
                                  ["verl-data", "--out", "verl"]])
def test_a_wrong_key_fails_before_torch_is_imported(argv):
    imported, err = heavy_imports_of(f"assert main({argv + ['trainer.learning_rate=1e-5']!r}) == 2")
    assert imported == [] and "unknown config key 'trainer.learning_rate'" in err


def test_config_show_does_not_import_torch():
    imported, err = heavy_imports_of("with contextlib.redirect_stdout(io.StringIO()):\n"
                                     "    assert main(['config', 'show']) == 0\n"
                                     "assert main(['config', 'show', 'algorithm.policy_loss=nope']) == 2")
    assert imported == [] and "algorithm.policy_loss='nope' is not allowed" in err


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_command_line_makes_openmp_threads_sleep_unless_told_otherwise(given, expected):
    # In a fresh interpreter, as a user's `aepo`: the policy is in the environment before torch (and
    # so its OpenMP runtime) is first imported, and a policy the user set is left alone.
    script = ("import os, sys, contextlib, io\n"
              "from aepo_rl.cli import main\n"
              "assert 'torch' not in sys.modules\n"
              "with contextlib.redirect_stdout(io.StringIO()):\n"
              "    assert main(['config', 'show']) == 0\n"
              "print(os.environ.get('OMP_WAIT_POLICY'))\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


@pytest.mark.parametrize("name", ["POLICY_LOSSES", "ADVANTAGE_ESTIMATORS", "ARCHITECTURES"])
def test_declared_builtin_names_are_what_the_module_registers(name):
    reg = getattr(registry, name)
    importlib.import_module(reg.builtins)
    assert sorted(reg.builtin_names) == [n for n in reg if reg.lookup(n).__module__ == reg.builtins]
