"""How the backend is found: by name through the `torch_dynamo_backends` entry point
Prism's distribution declares, with nothing imported first; or by importing runtime.torch
(a source tree run without installing). The rest of `runtime` never needs torch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROUP = "torch_dynamo_backends"

# the discovery `torch.compile(backend="prism")` runs (registry.lookup_backend), without
# importing every other backend first
FIND = """
import json, sys
from torch._dynamo.backends import registry
registry._discover_entrypoint_backends()
before = "runtime.torch" in sys.modules
found = registry._BACKENDS["prism"].load()
import runtime.torch.backend
print(json.dumps({"before": before, "listed": "prism" in registry._BACKENDS,
                  "same": found is runtime.torch.backend.prism}))
"""

WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # as if the torch extra were not installed
import runtime, runtime.host.manager, runtime.partition, runtime.devices.manager
import app.cli
from runtime.torch import options  # noqa
"""

# a network whose sizes onnx's shape inference leaves unknown, so that onnxruntime's
# symbolic inference sizes them at load (its module sits in a package importing torch)
SERVE = """
import json, sys
import numpy as np
from runtime.devices import parse_devices
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds
graph = load_graph(sys.argv[1])
with HostManager(parse_devices("cpu:2")) as host:
    host.add_network("m", graph, partition="balanced")
    host.infer("m", random_feeds(input_specs(graph), np.random.default_rng()))
print(json.dumps({"torch": sorted(m for m in sys.modules if m.split(".")[0] == "torch"),
                  "symbolic": "prism_symbolic_shape_infer" in sys.modules}))
"""


def declared() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["entry-points"][GROUP]


def test_torch_finds_the_backend_by_its_entry_point(tmp_path):
    """A distribution whose metadata holds exactly what pyproject.toml declares (as an
    install writes it): torch lists `prism` and loads runtime.torch.backend.prism."""
    assert declared() == {"prism": "runtime.torch.backend:prism"}
    info = tmp_path / "prism_entry_check-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: prism-entry-check\n"
                                   "Version: 0.0\n")
    (info / "entry_points.txt").write_text(
        f"[{GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in declared().items()))
    done = subprocess.run([sys.executable, "-c", FIND], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": f"{tmp_path}:{ROOT}",
                                                       "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "before": False, "listed": True, "same": True}


def test_runtime_imports_without_torch():
    """Everything but the torch room imports with torch absent; the room itself says, in
    one line, what to install."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == "ImportError: runtime.torch needs PyTorch: pip install " \
                   "'prism-runtime[torch]'", done.stderr[-1500:]


def test_serving_a_network_never_imports_torch(tmp_path):
    """Loading, planning and running a network leave torch unimported where it is
    installed (0.9 s and 180 MB resident a process), symbolic inference included (an
    empty cache: a kept answer would not run it)."""
    assert importlib.util.find_spec("torch") is not None  # the suite installs the extra
    done = subprocess.run([sys.executable, "-c", SERVE, str(ROOT / "tests/real_models/gpt2.onnx")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PRISM_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"torch": [], "symbolic": True}
