"""Every code block of README.md and docs/*.md runs as written, so an example that drifts from
the code fails here.

- ```python blocks are executed, each in a fresh namespace, in a working folder that holds what
  the docs tell a reader to have: a trained run's folder ``runs/my-run/`` with its step-20
  checkpoint (written by the trainer's own checkpoint function, with the tiny model of
  conftest.py) and every YAML file a block names in its first line (``# my.yaml``).
- Every ``aepo ...`` command (of a ```bash / ```sh / ```console block, or a line starting with
  ``aepo`` in any other block) goes through the real CLI: ``aepo_rl.cli.main``, i.e.
  ``build_parser()`` and ``load_config`` with the command's preset, YAML file, plugins and
  dotted overrides. Cheap commands run for real (``aepo config ...``, ``--help``); for the long
  ones (train, sft, eval, compare, rollout, serve-search, report) the job function the
  subcommand calls is replaced by a recorder, so the command is checked up to the moment the
  job would start.
- Paths into a run's ``checkpoints/`` anywhere in the docs must name a folder the trainer writes.
- By rule, these programs are not run: ``pip`` (installs packages), ``pytest`` (this suite
  itself), ``vllm`` (a GPU inference server) and ``curl`` (talks to a server started by another
  command of its block). Each such line is a visible skip with its reason.
- A block is left out only by an HTML comment on the line before it, ``<!-- not run: why -->``;
  each is a visible skip, and NOT_RUN_BLOCKS counts them, so a new one is a deliberate change.
- lab/ is not scanned: its notebook's commands are the record of what ran at each entry's commit, kept as
  written (today's CLI may have moved on), and its scripts have tests of their own
  (tests/test_docs_refs.py does check lab/'s links and references).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import _trl_missing

from aepo_rl import cli, registry
from aepo_rl.train.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*```(\S*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.+?)\s*-->\s*$")
NOT_RUN_BLOCKS = 13  # the blocks marked `<!-- not run: ... -->`; change it with the marks
SKIPPED_PROGRAMS = {
    "pip": "installs packages",
    "pytest": "runs this test suite itself",
    "vllm": "starts a GPU inference server",
    "curl": "talks to the server started by another command of its block",
}
# The function each long-running subcommand hands its work to (module, name); replaced by a recorder.
JOBS = {"train": ("aepo_rl.api", "train_main"), "sft": ("aepo_rl.train.sft", "sft_main"),
        "eval": ("aepo_rl.evaluate", "eval_main"), "compare": ("aepo_rl.compare", "compare_main"),
        "rollout": ("aepo_rl.rollout.cli", "rollout_main"), "serve-search": ("aepo_rl.tools.server", "serve_main"),
        "report": ("aepo_rl.report", "report_main"), "probe": ("aepo_rl.probes", "probe_main")}
RUN = "runs/my-run"  # the run folder the docs' examples use (docs/training.md: the run folder)
AEPO_LINE = re.compile(r"aepo\s+(-|[a-z])")  # a command, not a table row that starts with the preset's name
CHECKPOINT_PATH = re.compile(r"checkpoints/(step_[^/\s`'\")\]]*)(/[\w.-]+)?")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, counted from 1
    lang: str
    text: str
    not_run: str | None  # the reason of a `<!-- not run: ... -->` mark

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{path.relative_to(ROOT)}:{start + 1}: code block never closed"
        before = next((line for line in reversed(lines[:start]) if line.strip()), "")
        mark = NOT_RUN.match(before)
        blocks.append(Block(path, start + 1, m.group(1).lower(), "\n".join(body), mark.group(1) if mark else None))
        i += 1
    return blocks


BLOCKS = [block for path in DOCS for block in code_blocks(path)]


@dataclass(frozen=True)
class Command:
    block: Block
    line: int
    argv: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.block.path.relative_to(ROOT)}:{self.line}"


def commands(block: Block) -> list[Command]:
    """The commands of a shell block (continuation lines joined, comments and ``$ `` prompts
    dropped), or the ``aepo`` lines of any other block."""
    found, pending, first = [], "", 0
    for offset, raw in enumerate(block.text.splitlines(), start=block.line + 1):
        line = raw.strip()
        if block.lang == "console":
            if not line.startswith("$ ") and not pending:
                continue  # output
            line = line.removeprefix("$ ")
        elif block.lang not in SHELL and not AEPO_LINE.match(line) and not pending:
            continue
        if not pending:
            first = offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        argv = shlex.split(pending + line, comments=True)
        pending = ""
        if argv:
            found.append(Command(block, first, tuple(argv)))
    return found


COMMANDS = [c for b in BLOCKS if b.not_run is None and (b.lang in SHELL or "aepo" in b.text) for c in commands(b)]
PYTHON = [b for b in BLOCKS if b.lang == "python"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model, tiny_tokenizer):
    """A folder with a trained run's step-20 checkpoint and the YAML files the docs name."""
    folder = tmp_path_factory.mktemp("docs")
    (folder / "examples").symlink_to(ROOT / "examples")  # the docs' commands run from the repository root
    save_checkpoint(folder / RUN / "checkpoints", 20, tiny_model, tiny_tokenizer, {"step": 20}, keep=1)
    for block in BLOCKS:
        first = block.text.splitlines()[0] if block.text else ""
        if block.lang == "yaml" and (m := re.match(r"#\s*(\S+\.ya?ml)\s*$", first)):
            (folder / m.group(1)).write_text(block.text)
    return folder


@pytest.fixture
def in_workdir(workdir, monkeypatch):
    """Run in the working folder; afterwards every registry and sys.modules are as before."""
    monkeypatch.chdir(workdir)
    registries = [r for r in vars(registry).values() if isinstance(r, registry.Registry)]
    for reg in registries:
        with contextlib.suppress(StopIteration):
            reg.lookup(next(iter(reg)))  # loads the built-in entries first
    saved = [(reg, dict(reg._entries), dict(reg._capabilities)) for reg in registries]
    modules = set(sys.modules)
    yield workdir
    for reg, entries, capabilities in saved:
        reg._entries.clear(), reg._capabilities.clear()
        reg._entries.update(entries), reg._capabilities.update(capabilities)
    for name in set(sys.modules) - modules:
        if name.startswith("aepo_rl_plugin_"):
            del sys.modules[name]


def test_the_docs_have_code_to_run():
    assert len(PYTHON) >= 10 and len(COMMANDS) >= 40, (len(PYTHON), len(COMMANDS))
    marked = [b.where for b in BLOCKS if b.not_run is not None]
    assert len(marked) == NOT_RUN_BLOCKS, (f"blocks marked `not run`: {marked}; a new mark is a deliberate "
                                           "change: update NOT_RUN_BLOCKS")


def test_every_not_run_mark_stands_before_a_code_block():
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if NOT_RUN.match(line):
                after = next((x for x in lines[i + 1:] if x.strip()), "")
                assert FENCE.match(after), f"{path.relative_to(ROOT)}:{i + 1}: a `not run` mark before no code block"


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.where)
def test_python_block_runs(block, in_workdir, capsys):
    if block.not_run:
        pytest.skip(f"not run: {block.not_run}")
    if "aepo_rl.integrations.trl" in block.text and (reason := _trl_missing()):
        pytest.skip(reason)
    code = compile(block.text, block.where, "exec")
    exec(code, {"__name__": f"docs_block_{block.line}"})


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.not_run and b.lang != "python"], ids=lambda b: b.where)
def test_marked_block_is_a_visible_skip(block):
    pytest.skip(f"not run: {block.not_run}")


class Recorder:
    """Stands in for a subcommand's job function: remembers its arguments, returns 0."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return 0


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.where)
def test_shell_command_runs(command, in_workdir, monkeypatch, capsys):
    program, *args = command.argv
    if program in SKIPPED_PROGRAMS:
        pytest.skip(f"{program} is not run by rule: it {SKIPPED_PROGRAMS[program]}")
    assert program == "aepo", (f"{command.where}: `{program}` is neither aepo nor a program this test skips by "
                               f"rule ({', '.join(SKIPPED_PROGRAMS)}); show an aepo command or mark the block")
    recorders = {}
    for subcommand, (module, name) in JOBS.items():
        recorders[subcommand] = Recorder()
        monkeypatch.setattr(f"{module}.{name}", recorders[subcommand])
    status = cli.main(list(args))
    out = capsys.readouterr()
    assert status == 0, f"{command.where}: `{shlex.join(command.argv)}` exits with {status}:\n{out.err}"
    subcommand = next((a for a in args if a in JOBS or a == "config"), None)
    if subcommand in JOBS:
        assert recorders[subcommand].calls, f"{command.where}: `{shlex.join(command.argv)}` did not start its job"


@pytest.mark.parametrize("argv", [["--help"], *[[name, "--help"] for name in [*JOBS, "config"]]], ids=" ".join)
def test_help_of_every_subcommand(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 0
    assert "usage: aepo" in capsys.readouterr().out


def test_checkpoint_paths_are_the_ones_the_trainer_writes(tmp_path, tiny_model, tiny_tokenizer):
    """Every ``checkpoints/step_.../...`` in the docs names a folder ``save_checkpoint`` writes."""
    written: dict[int, set[str]] = {}
    wrong = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in CHECKPOINT_PATH.finditer(text):
            name, inside = m.group(1), (m.group(2) or "").lstrip("/")
            digits = re.fullmatch(r"step_(\d+)", name)
            if digits is None:
                wrong.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
                             " (give a step number, e.g. step_000020)")
                continue
            step = int(digits.group(1))
            if step not in written:
                folder = save_checkpoint(tmp_path / str(step), step, tiny_model, tiny_tokenizer, {}, keep=1)
                written[step] = {folder.name, *(f"{folder.name}/{p.name}" for p in folder.iterdir())}
            if name not in written[step] or (inside and f"{name}/{inside}" not in written[step]):
                expected = sorted(p for p in written[step] if "/" in p)
                wrong.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)} "
                             f"(the trainer writes {', '.join(expected)})")
    assert not wrong, "paths into checkpoints/ that the trainer does not write:\n" + "\n".join(wrong)
