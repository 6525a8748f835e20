"""The import contracts in pyproject.toml ([tool.importlinter]): arrows point one way.

`runtime` imports neither `app` nor the dashboards (nor textual or streamlit); the
devices know nothing of partitioning; the generic device code imports no backend; a plan
builds on its memory plan, not the other way. import-linter follows every import, those
inside functions too, and indirect chains.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = "from importlinter.cli import lint_imports; raise SystemExit(lint_imports(" \
       "no_cache=True, no_logo=True))"


def test_import_contracts_are_kept():
    done = subprocess.run([sys.executable, "-c", LINT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 broken" in done.stdout and "BROKEN" not in done.stdout, done.stdout
