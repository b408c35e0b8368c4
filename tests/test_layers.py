"""The import graph of aepo_rl/ keeps the layers of docs/architecture.md: read from the code (ast), checked against
the layer table of that page; tools never import tasks; no circle; no aepo_rl or standard-library import inside a
function outside the places the page names; and the page lists every module."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "aepo_rl"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

DEFERRED_IMPORTS_ALLOWED = ("cli.py", "__init__.py", "engines/__init__.py", "integrations/")
"""Where an aepo_rl or standard-library import may sit inside a function (docs/architecture.md, Rules): the command
line (``cli.py``) and the package face (``__init__.py``, AEPOTrainer on first use) keep ``aepo config show`` free of
torch; ``engines/__init__.py`` registers the engines, whose modules load when one is built; the optional
integrations load verl or TRL when asked."""


# ---------------------------------------------------------------- reading the code

def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module under ``root``, by dotted name."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def imports(path: Path, known: set[str], root: Path = PACKAGE) -> tuple[set[str], list[tuple[int, str]]]:
    """The package's modules ``path`` imports at module level (``if TYPE_CHECKING:`` included), and ``(line, module)``
    for each import inside a function (any module). ``from pkg import mod`` counts as an import of ``pkg.mod``."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top: set[str] = set()
    inner: list[tuple[int, str]] = []

    def targets(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        base = node.module or ""
        if node.level:
            parent = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join(parent + ([base] if base else []))
        return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            deeper = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in targets(child):
                    if in_function:
                        inner.append((child.lineno, target))
                    elif target.split(".")[0] == root.name:
                        top.add(next((m for m in _prefixes(target) if m in known), target))
            visit(child, deeper)

    visit(ast.parse(path.read_text(), str(path)), False)
    return top - {name}, inner


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imports(path, set(found), root)[0] for name, path in found.items()}


# ---------------------------------------------------------------- the rules

def read_layers(text: str) -> list[tuple[str, list[str]]]:
    """The rows of the layer table (``| <n>. <name> | `a.py`, `b/` | ...``), bottom up: (name, entries without
    ``.py`` or ``/``: ``config``, ``tasks``, ``engines/__init__``)."""
    rows = []
    for line in text.splitlines():
        match = re.match(r"\|\s*(\d+)\.\s*([^|]+)\|([^|]+)\|", line)
        if match:
            entries = [e.removesuffix("/").removesuffix(".py") for e in re.findall(r"`([^`]+)`", match.group(3))]
            rows.append((f"{match.group(1)}. {match.group(2).strip()}", entries))
    return rows


def layer_of(module: str, layers: list[tuple[str, list[str]]], package: str = "aepo_rl") -> int | None:
    """The index of the layer whose entry names ``module`` (the longest match: ``engines/__init__`` over
    ``engines``), or None."""
    relative = module.removeprefix(package).lstrip(".").replace(".", "/") or "__init__"
    best = None
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            if relative == entry or relative.startswith(entry + "/"):
                if best is None or len(entry) > len(best[1]):
                    best = (index, entry)
    return None if best is None else best[0]


def upward_arrows(graph: dict[str, set[str]], layers) -> list[str]:
    """Every import of a module in a higher layer, as ``a (layer) -> b (layer)``."""
    wrong = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            low, high = layer_of(source, layers), layer_of(target, layers)
            if low is not None and high is not None and high > low:
                wrong.append(f"{source} ({layers[low][0]}) -> {target} ({layers[high][0]})")
    return wrong


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module, or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def deferred_imports(found: dict[str, Path], root: Path = PACKAGE) -> list[str]:
    """Imports inside functions of an aepo_rl or standard-library module, outside :data:`DEFERRED_IMPORTS_ALLOWED`
    (third-party packages may be imported where they are used: optional extras and heavy libraries)."""
    wrong = []
    for name, path in found.items():
        relative = path.relative_to(root).as_posix()
        if any(relative == allowed or relative.startswith(allowed) for allowed in DEFERRED_IMPORTS_ALLOWED):
            continue
        for line, target in imports(path, set(found), root)[1]:
            top = target.split(".")[0]
            if top == root.name or top in sys.stdlib_module_names:
                wrong.append(f"{root.name}/{relative}:{line} imports {target} inside a function")
    return wrong


# ---------------------------------------------------------------- the checks on aepo_rl

LAYERS = read_layers(ARCHITECTURE.read_text())
GRAPH = import_graph()


def test_the_layer_table_is_read_from_the_architecture_page():
    names = [name for name, _ in LAYERS]
    assert len(names) >= 5 and [n.split(".")[0] for n in names] == [str(i) for i in range(len(names))], names


def test_every_module_has_a_layer():
    assert [m for m in GRAPH if layer_of(m, LAYERS) is None] == []


def test_no_module_imports_from_a_higher_layer():
    assert upward_arrows(GRAPH, LAYERS) == []


def test_no_import_circle():
    assert circles(GRAPH) == []


def test_tools_never_import_tasks_and_engines_know_no_tasks_tools_or_training():
    for source, targets in GRAPH.items():
        for part, forbidden in (("tools", ("tasks",)), ("engines", ("tasks", "tools", "rollout", "train"))):
            if source == f"aepo_rl.{part}" or source.startswith(f"aepo_rl.{part}."):
                assert not [t for t in targets if any(t == f"aepo_rl.{f}" or t.startswith(f"aepo_rl.{f}.")
                                                      for f in forbidden)], source


def test_algorithms_import_only_each_other_their_config_and_registry():
    allowed = ("aepo_rl.algorithms", "aepo_rl.config", "aepo_rl.registry")
    for source, targets in GRAPH.items():
        if source.startswith("aepo_rl.algorithms"):
            assert all(t.startswith(allowed) for t in targets), (source, targets)


def test_no_import_inside_a_function_outside_the_allowed_places():
    assert deferred_imports(modules()) == []


def layout_entries(text: str) -> set[str]:
    """The paths the package layout block of the architecture page lists (``models/tiny.py``, ``cli.py``,
    ``integrations/verl/plugin.py``), from its indentation."""
    block = text.split("## Package layout", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    listed, folders = set(), []  # folders: (indent, name)
    for line in block.splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if not stripped or indent >= 20:  # a description's continuation
            continue
        names = re.split(r"\s{2,}", stripped, maxsplit=1)[0]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        prefix = "/".join(name for _, name in folders[1:])  # the first folder is aepo_rl/
        for name in (n.strip() for n in names.split(",")):
            if name.endswith("/"):
                folders.append((indent, name.rstrip("/")))
                listed.add(f"{prefix}/{name}".lstrip("/"))
            elif name.endswith(".py"):
                listed.add(f"{prefix}/{name}".lstrip("/"))
    return listed


def test_the_architecture_page_lists_every_module():
    listed = layout_entries(ARCHITECTURE.read_text())
    missing = [path.relative_to(PACKAGE).as_posix() for path in modules().values()
               if path.name != "__init__.py" or path.parent == PACKAGE]
    assert [path for path in missing if path not in listed] == []
    assert [path for path in listed if path.endswith(".py") and not (PACKAGE / path).is_file()] == []


# ---------------------------------------------------------------- the checker fails where it should

def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "aepo_rl"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


SYNTHETIC_LAYERS = "| 0. leaves | `config.py` | |\n| 1. blocks | `tools/` | |\n| 2. environment | `tasks/` | |\n"


def test_the_checker_finds_a_reintroduced_circle_and_an_upward_arrow(tmp_path):
    package = write_package(tmp_path, {
        "config.py": "",
        "tools/__init__.py": "",
        "tools/corpus.py": "def load():\n    from aepo_rl.tasks.synthetic import build_world\n",
        "tools/search.py": "from aepo_rl.tools.corpus import load\n",
        "tasks/__init__.py": "",
        "tasks/synthetic.py": "from aepo_rl.tools.search import load\nfrom aepo_rl import config\n",
    })
    layers = read_layers(SYNTHETIC_LAYERS)
    graph = import_graph(package)
    assert graph["aepo_rl.tasks.synthetic"] == {"aepo_rl.tools.search", "aepo_rl.config"}
    assert circles(graph) == []  # the import inside a function hides the circle from the module-level graph ...
    assert deferred_imports(modules(package), package) == [  # ... and is refused itself
        "aepo_rl/tools/corpus.py:2 imports aepo_rl.tasks.synthetic inside a function"]
    (package / "tools/corpus.py").write_text("from aepo_rl.tasks.synthetic import build_world\n")  # hoisted
    graph = import_graph(package)
    assert circles(graph) == [["aepo_rl.tasks.synthetic", "aepo_rl.tools.corpus", "aepo_rl.tools.search"]]
    assert upward_arrows(graph, layers) == ["aepo_rl.tools.corpus (1. blocks) -> "
                                            "aepo_rl.tasks.synthetic (2. environment)"]


def test_the_checker_reads_relative_imports_and_allows_third_party_deferred_imports(tmp_path):
    package = write_package(tmp_path, {
        "config.py": "from .tools import base\n",
        "tools/__init__.py": "",
        "tools/base.py": "def f():\n    import vllm\n    import json\n",
    })
    graph = import_graph(package)
    assert graph["aepo_rl.config"] == {"aepo_rl.tools.base"}
    assert upward_arrows(graph, read_layers(SYNTHETIC_LAYERS)) == [
        "aepo_rl.config (0. leaves) -> aepo_rl.tools.base (1. blocks)"]
    assert deferred_imports(modules(package), package) == ["aepo_rl/tools/base.py:3 imports json inside a function"]


@pytest.mark.parametrize("module, layer", [("aepo_rl.engines", 1), ("aepo_rl.engines.hf", 1), ("aepo_rl.config", 0),
                                           ("aepo_rl.other", None)])
def test_a_module_takes_the_layer_of_its_longest_entry(module, layer):
    layers = [("0. leaves", ["config"]), ("1. engines", ["engines"]), ("2. faces", ["engines/__init__x"])]
    assert layer_of(module, layers) == layer
