"""docs/architecture.md stays the map of the tree: its "Parts" tree names every package of
megatron_zeppelin (every folder with an __init__.py) and only folders and files that exist, and
every path the page names exists.

A path on the page is a word ending in a file extension (.py, .yaml, .md, ...) or in "/", read from
the repository root or from the package (the page writes `planner/program.py` for
megatron_zeppelin/planner/program.py); a bare name (`partition.py`, `cost/`) must name something in
the repository. Globs (`integration/cpu*.py`) must match something.
"""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "megatron_zeppelin"
PAGE = REPO / "docs" / "architecture.md"
TOP_SKIP = {".git", ".venv", ".venv-mlm", "results", "build", "dist"}  # not the project's own files
PATH = re.compile(r"(?<![\w./*-])([\w*.-]+(?:/[\w*.-]+)*(?:/|\.(?:py|yaml|md|sh|json|ini|tmpl|patch)))(?![\w/])")


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def parts_tree(text: str):
    """(path, line) of every entry of the Parts tree: indentation two spaces per level; a line blank
    up to the description column continues the description above."""
    block = _section(text, "Parts").split("```\n", 2)[1]
    lines = [ln for ln in block.splitlines() if ln.strip()]
    first = lines[0]
    col = len(first) - len(first[len(first.split()[0]):].lstrip())  # where descriptions start
    stack, out = [], []
    for ln in lines:
        if not ln[:col].strip():
            continue  # a continued description
        depth, name = (len(ln) - len(ln.lstrip())) // 2, ln.split()[0]
        assert depth <= len(stack), f"entry indented past its parent: {ln!r}"
        stack = stack[:depth] + [name]
        out.append(("".join(stack), ln))
    return out


def _files():
    for p in REPO.rglob("*"):
        parts = p.relative_to(REPO).parts
        if parts[0] not in TOP_SKIP and not parts[0].endswith(".egg-info") and "__pycache__" not in parts:
            yield p


def named_path_exists(path: str) -> bool:
    for base in (REPO, PACKAGE):
        found = list(base.glob(path.rstrip("/")))
        if any(p.is_dir() for p in found) if path.endswith("/") else found:
            return True
    if "/" not in path.rstrip("/"):  # a bare name: anywhere in the repository
        name, is_dir = path.rstrip("/"), path.endswith("/")
        return any(p.match(name) and p.is_dir() == is_dir for p in _files())
    return False


def test_the_parts_tree_names_every_package():
    named = {path for path, _ in parts_tree(PAGE.read_text())}
    packages = sorted(str(p.parent.relative_to(REPO)) + "/" for p in PACKAGE.rglob("__init__.py")
                      if "__pycache__" not in p.parts)
    assert len(packages) > 20
    missing = [p for p in packages if p not in named]
    assert missing == [], f"packages the Parts tree of docs/architecture.md does not name: {missing}"


def test_every_entry_of_the_parts_tree_exists():
    entries = parts_tree(PAGE.read_text())
    assert [ln for path, ln in entries if not (REPO / path).exists()] == []
    assert {"benchmarks/", "scripts/", "tests/", "megatron_zeppelin/presets/clusters/"} <= {p for p, _ in entries}


def test_every_path_the_page_names_exists():
    text = PAGE.read_text()
    tree = _section(text, "Parts").split("```\n", 2)[1]
    prose = text.replace(tree, "")  # the tree's names are paths from their parents (tested above)
    named = sorted(set(PATH.findall(prose)) | set(m for ln in tree.splitlines() for m in PATH.findall(ln)[1:]))
    assert len(named) > 30
    missing = [p for p in named if not named_path_exists(p)]
    assert missing == [], f"docs/architecture.md names paths that do not exist: {missing}"


@pytest.mark.parametrize("path, exists", [("planner/program.py", True), ("attention/kernels.py", False),
                                          ("attention/kernels/", True), ("integration/cpu*.py", True),
                                          ("partition.py", True), ("cost/", True), ("nowhere.py", False)])
def test_path_resolution(path, exists):
    assert named_path_exists(path) == exists
