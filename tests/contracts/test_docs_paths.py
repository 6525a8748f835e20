"""Every repository path and module the docs name exists.

The docs (README.md and docs/*.md) name files and folders (`runtime/host/lean.py`,
`app/server/`, `pyproject.toml`) and modules (`runtime.host.dispatch`). When code moves,
those names go stale without a sound; this finds them by their form, not from a list:

- a path: a token starting with one of the repository's top folders and a slash, in
  backticks or plain text, which must exist (a `*` in it is a glob that must match);
- a top-level file: a backticked bare name of the kind a repository root holds
  (`Makefile`, `README.md`, `*.toml`, `*.lock`, `*.txt`, `*.cfg`, `*.ini`, `*.md`);
- a module: a dotted name starting with a Python top folder, whose packages and module
  must be files here; a part after the module (`runtime.driver.open_bundle`) must be a
  name that module's source holds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

PACKAGES = ("runtime", "app", "ui_tui", "ui_web", "benchmarks")
FOLDERS = (*PACKAGES, "sample_models", "docs", "tests")
PATH = re.compile(rf"(?<![\w./-])(?:{'|'.join(FOLDERS)})/[\w./*-]*")
ROOT_FILE = re.compile(r"`(Makefile|[A-Z][A-Z_]+\.md|[a-z][\w-]*\.(?:toml|lock|txt|cfg|ini|md))`")
MODULE = re.compile(rf"(?<![\w./-])(?:{'|'.join(PACKAGES)})(?:\.\w+)+")
FILE_ENDINGS = {"py", "md", "json", "toml", "onnx", "txt"}  # `app.py` is a file, not a module


def path_exists(name: str) -> bool:
    name = name.rstrip(".")
    return any(ROOT.glob(name)) if "*" in name else (ROOT / name).exists()


def module_exists(dotted: str) -> bool:
    """Packages and a module as files here; then, if named, one attribute in its source."""
    first, *rest = dotted.split(".")
    where = ROOT / first
    for part in rest:
        if where.is_dir() and (where / part).is_dir():
            where = where / part
        elif where.is_dir() and (where / f"{part}.py").is_file():
            where = where / f"{part}.py"
        else:  # an attribute of the module (or package) reached so far
            source = where / "__init__.py" if where.is_dir() else where
            return source.is_file() and re.search(rf"\b{part}\b", source.read_text()) is not None
    return where.exists()


def stale_names(text: str) -> list[str]:
    """`line: name` for each path, root file or module in `text` that does not exist."""
    stale = []
    for number, line in enumerate(text.splitlines(), 1):
        stale += [f"{number}: {m}" for m in PATH.findall(line) if not path_exists(m)]
        stale += [f"{number}: {m}" for m in ROOT_FILE.findall(line) if not path_exists(m)]
        stale += [f"{number}: {m}" for m in MODULE.findall(line)
                  if m.rsplit(".", 1)[-1] not in FILE_ENDINGS and not module_exists(m)]
    return stale


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_in_the_doc_exists(doc: Path):
    assert doc.is_file()
    stale = stale_names(doc.read_text(encoding="utf-8"))
    assert not stale, f"{doc.relative_to(ROOT)} names what does not exist:\n" + "\n".join(stale)


def test_the_architecture_doc_is_read_for_names():
    """The patterns find the names the architecture doc is full of (none, and the test
    above would pass on anything)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert len(PATH.findall(text)) > 50 and MODULE.findall(text) and ROOT_FILE.findall(text)


def test_a_stale_name_is_caught():
    text = ("`runtime/host/lean.py` and runtime/nowhere.py, `app/server/`, `pyproject.toml`,\n"
            "`setup.cfg`, runtime.host.dispatch, runtime.driver.open_bundle, runtime.hsot.x,\n"
            "runtime.driver.no_such_name and app/*_cmd.py but not tests/none_*.py")
    assert stale_names(text) == ["1: runtime/nowhere.py", "2: setup.cfg", "2: runtime.hsot.x",
                                 "3: tests/none_*.py", "3: runtime.driver.no_such_name"]
