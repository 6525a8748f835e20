"""The runtime is headless: importing it pulls in neither Textual nor Streamlit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import runtime, runtime.host.manager, runtime.observe.events, runtime.observe.metrics
import runtime.partition
import runtime.devices.manager
ui = sorted(m for m in sys.modules
            if m.split(".")[0].startswith(("textual", "streamlit")))
print(json.dumps({"ui": ui, "host": "runtime.host.manager" in sys.modules}))
"""


def test_runtime_imports_no_ui_toolkit():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["host"]
    assert result["ui"] == [], result["ui"]


def test_probe_would_see_a_ui_module():
    """The probe itself works: a module named like a UI toolkit is reported."""
    probe = "import sys, types; sys.modules['textual_fake'] = types.ModuleType('x')\n" + PROBE
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["ui"] == ["textual_fake"]
