"""Cross-references resolve: every § points at a section of docs/algorithm.md, no text cites a
document outside the repository or an issue number, relative Markdown links reach files and headings;
and the README stays within 10 KB."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALGORITHM = ROOT / "docs" / "algorithm.md"
TEXT_SUFFIXES = {".py", ".md", ".txt", ".yaml", ".yml", ".toml", ".cfg", ".json", ".jsonl", ".sh"}

SECTION_REF = re.compile(r"§\s?(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{2,6}\s+(.*)$", re.M)
NUMBERED = re.compile(r"(\d+(?:\.\d+)*)\.?\s+\S")
# The old design document's file name, spelled in two pieces so this file does not contain it.
OUTSIDE_DOCUMENT = "aepo-" + "algorithm.md"
ISSUE_REF = re.compile(r"\bissues?\s*#?\s*\d+", re.I)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
MD_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def scanned_files() -> list[Path]:
    """Code, tests, benchmarks, examples, the lab, the README and the docs pages: every place a reader meets a
    reference."""
    files = [ROOT / "README.md"] if (ROOT / "README.md").exists() else []
    files += sorted((ROOT / "docs").glob("*.md"))
    for folder in ("aepo_rl", "tests", "benchmarks", "examples", "lab"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES
                        and "__pycache__" not in p.parts)
    return files


def markdown_files() -> list[Path]:
    """The README, the docs pages and every Markdown file of examples/ and lab/ (the notebook links into docs/)."""
    return ([ROOT / "README.md"] if (ROOT / "README.md").exists() else []) + sorted((ROOT / "docs").glob("*.md")) + [
        p for folder in ("examples", "lab") for p in sorted((ROOT / folder).rglob("*.md"))]


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def where(path: Path, text: str, pos: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, pos) + 1}"


def algorithm_sections(text: str) -> list[str]:
    """The numbers of the numbered headings of docs/algorithm.md ("1", "1.2", ...)."""
    return [m.group(1) for m in (NUMBERED.match(h) for h in HEADING.findall(text)) if m]


def test_readme_is_the_front_door_not_the_manual():
    """The README stays within 10 KB (10,240 bytes); everything longer belongs on a page of docs/."""
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 10_240, f"README.md is {size} bytes, over 10,240: move the detail to a page of docs/ and link it"


def test_algorithm_document_has_numbered_unique_headings():
    assert ALGORITHM.exists(), "docs/algorithm.md is missing: every § in the code points at it"
    text = read(ALGORITHM)
    headings = HEADING.findall(text)
    unnumbered = [h for h in headings if not NUMBERED.match(h)]
    assert not unnumbered, f"docs/algorithm.md: headings without a section number: {unnumbered}"
    sections = algorithm_sections(text)
    duplicates = sorted({s for s in sections if sections.count(s) > 1})
    assert not duplicates, f"docs/algorithm.md: section numbers used twice: {duplicates}"
    # Sections 1 to 7 keep the numbering the code has cited from the start.
    for number in ("1", "1.1", "1.2", "1.3", "1.4", "1.5", "2", "2.1", "2.2", "2.3", "2.4", "3", "4", "5", "6", "7"):
        assert number in sections, f"docs/algorithm.md has no section {number}"


def test_every_section_reference_exists_in_the_algorithm_document():
    assert ALGORITHM.exists(), "docs/algorithm.md is missing: every § in the code points at it"
    sections = set(algorithm_sections(read(ALGORITHM)))
    dangling = []
    for path in scanned_files():
        text = read(path)
        for m in SECTION_REF.finditer(text):
            if m.group(1) not in sections:
                dangling.append(f"{where(path, text, m.start())}: §{m.group(1)}")
    assert not dangling, ("these § references have no section in docs/algorithm.md (fix the number or add "
                          "the section):\n" + "\n".join(dangling))


def test_no_reference_to_documents_outside_the_repository_or_to_issue_numbers():
    found = []
    for path in scanned_files():
        text = read(path)
        for m in re.finditer(re.escape(OUTSIDE_DOCUMENT), text):
            found.append(f"{where(path, text, m.start())}: cites {OUTSIDE_DOCUMENT}; cite docs/algorithm.md")
        for m in ISSUE_REF.finditer(text):
            found.append(f"{where(path, text, m.start())}: '{m.group(0)}'; state the requirement itself")
    assert not found, "\n".join(found)


def markdown_links(text: str) -> list[tuple[int, str]]:
    """(position, target) of every Markdown link outside code that is not a URL."""
    blank = lambda m: " " * len(m.group(0))  # noqa: E731 - keeps positions (line numbers) intact
    prose = INLINE_CODE.sub(blank, FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text))
    return [(m.start(), m.group(1)) for m in MD_LINK.finditer(prose)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", m.group(1), re.I)]


def relative_links(text: str) -> list[tuple[int, str]]:
    """(position, target) of every Markdown link outside code that is neither a URL nor an anchor."""
    return [(pos, target) for pos, target in markdown_links(text) if not target.startswith("#")]


def test_relative_markdown_links_point_at_existing_files():
    broken = []
    for path in markdown_files():
        text = read(path)
        for pos, target in relative_links(text):
            file_part = target.split("#", 1)[0]
            if file_part and not (path.parent / file_part).exists():
                broken.append(f"{where(path, text, pos)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: the heading's text (link and code marks dropped, their words
    kept) in lower case, every character that is not a letter, digit, space, hyphen or underscore removed, spaces
    made hyphens; a repeated anchor gets -1, -2, ..."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", FENCE.sub("", text), re.M):
        words = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
        anchor = re.sub(r"[^\w\- ]", "", words).replace(" ", "-")
        candidate, i = anchor, 0
        while candidate in anchors:
            i += 1
            candidate = f"{anchor}-{i}"
        anchors.add(candidate)
    return anchors


def test_markdown_links_name_existing_headings():
    broken, anchors = [], {}  # anchors: each linked page's, read once
    for path in markdown_files():
        text = read(path)
        for pos, target in markdown_links(text):
            file_part, _, anchor = target.partition("#")
            page = (path.parent / file_part if file_part else path).resolve()
            if not anchor or page.suffix != ".md" or not page.exists():
                continue
            if page not in anchors:
                anchors[page] = heading_anchors(read(page))
            if anchor not in anchors[page]:
                broken.append(f"{where(path, text, pos)}: {target}")
    assert not broken, "links to headings that do not exist (GitHub's anchor of the heading):\n" + "\n".join(broken)


@pytest.mark.parametrize("heading, anchor", [
    ("## PhantomWiki (`task.name=phantomwiki`)", "phantomwiki-tasknamephantomwiki"),
    ("## The equivalence study (pre-registered): AEPO, ARPO and GRPO within ±3 points",
     "the-equivalence-study-pre-registered-aepo-arpo-and-grpo-within-3-points"),
    ("### 2.11 Rollout Correction and the target-KL guard (off-policy training)",
     "211-rollout-correction-and-the-target-kl-guard-off-policy-training"),
    ("## [`aepo probe`](x.md): each", "aepo-probe-each"),
])
def test_heading_anchors_as_github_makes_them(heading, anchor):
    assert anchor in heading_anchors(heading)
    assert {anchor, anchor + "-1"} <= heading_anchors(f"{heading}\n\n{heading}\n")
    assert not heading_anchors(f"```\n{heading}\n```\n")


@pytest.mark.parametrize("text, expected", [
    ("see [the algorithm](docs/algorithm.md#2-policy) and ![plot](docs/images/a.png)",
     ["docs/algorithm.md#2-policy", "docs/images/a.png"]),
    ("[web](https://arxiv.org/abs/2510.14545), [anchor](#set-up), `[x](not/a/link.md)`", []),
    ("```\n[x](inside/a/fence.md)\n```\n[y](after.md)", ["after.md"]),
])
def test_link_finder(text, expected):
    assert [target for _, target in relative_links(text)] == expected


def test_reference_patterns_catch_what_they_should():
    assert SECTION_REF.findall("(§1.2-§1.4), § 2.3, §7.") == ["1.2", "1.4", "2.3", "7"]
    word = "issue"  # kept apart from its number so that this file passes its own check
    assert ISSUE_REF.search(f"recall@5 ({word.title()} 4: ≥ 0.95)") and ISSUE_REF.search(f"see {word} #13")
    assert not ISSUE_REF.search("the queries the teacher issues (entity names)")
    assert algorithm_sections("## 2. Policy\n### 2.3 Surrogate\n#### 4.10 ARPO\n") == ["2", "2.3", "4.10"]


def test_install_commands_name_the_clone_not_a_package_index():
    # aepo-rl is installed from its clone (pip install -e ".[extra]"); installing it by name with an extra would
    # look for it on a package index, where it is not.
    index_install = re.compile(r"pip install[^\n`]*?['\"]?aepo-rl\[")
    found = [f"{path.relative_to(ROOT)}: {match.group(0)}" for path in scanned_files()
             for match in index_install.finditer(path.read_text(errors="replace"))]
    assert found == []
