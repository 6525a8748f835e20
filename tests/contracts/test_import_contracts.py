"""The import contracts in pyproject.toml ([tool.importlinter]): arrows point one way.

The dashboards build on `app`, `app` on `runtime`; `runtime`'s rooms are layered (a room
imports only rooms below it) and no package inside it has an import circle, imports made
for type checking included; the generic device code imports no backend; only the ray
modules import ray, and only the torch room (runtime/torch/) torch. import-linter follows
every import, those inside functions too, and indirect chains. The contracts are shown to
bite: a copy of the tree with one backward arrow, one circle, or torch imported outside its
room, breaks exactly the contract that forbids it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = "from importlinter.cli import lint_imports; raise SystemExit(lint_imports(" \
       "no_cache=True, no_logo=True))"
LAYERED = "the rooms of runtime/ are layered"
ACYCLIC = "no import circle inside runtime/"
TORCH = "only the torch room imports torch"


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, capture_output=True,
                          text=True, timeout=120)


def test_import_contracts_are_kept():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 broken" in done.stdout and "BROKEN" not in done.stdout, done.stdout


# (module, the line added to it, the contract it breaks)
BREAKS = {
    "backward arrow": ("runtime/versions.py", "import runtime.graph", LAYERED),
    "circle in a room": ("runtime/executor/requests.py",
                         "if TYPE_CHECKING:\n    from runtime.executor import executor",
                         ACYCLIC),
    "torch outside its room": ("runtime/host/lean.py", "import torch", TORCH),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_contracts_break_on_a_backward_arrow_or_a_circle(case, tmp_path):
    """A copy of the tree with one import added: the lint fails, naming the contract the
    import breaks, and keeps every other."""
    for part in ("runtime", "app", "ui_tui", "ui_web"):
        shutil.copytree(ROOT / part, tmp_path / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    module, line, contract = BREAKS[case]
    source = tmp_path / module
    text = source.read_text()
    if "TYPE_CHECKING" in line and "TYPE_CHECKING" not in text:
        line = "from typing import TYPE_CHECKING\n" + line
    source.write_text(text + "\n" + line + "\n")
    done = lint(tmp_path)
    assert done.returncode != 0, done.stdout
    # a row reads "<contract> BROKEN", then "(N ignored imports)" where it ignores some
    broken = [row.split(" BROKEN")[0] for row in done.stdout.splitlines() if " BROKEN" in row]
    assert broken == [contract], done.stdout
