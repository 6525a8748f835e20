"""Loading a large model: a new process to its first answer, and the memory it takes.

A 200 MB float MLP (twelve 2048x2048 MatMuls with Relu, weights inside the file), in
fresh interpreters that first import numpy and onnxruntime: plain onnxruntime (a session
from the file, one run) against `HostManager.add_network` on `cpu:2` with default
settings (one run). Per process: seconds to the answer, its peak resident memory, and
what it holds once loaded, each less the memory before the load. Ratios against
onnxruntime measured the same way, in the same run (docs/performance.md, "Loading
large models").
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks.common import result

ROOT = Path(__file__).resolve().parent.parent
WIDTH, LAYERS = 2048, 12

_PRELUDE = """
import sys, time
import numpy, onnxruntime

def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) << 10

feeds = {"x": numpy.random.default_rng().standard_normal((4, int(sys.argv[2])))
         .astype(numpy.float32)}
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # the peak counts from here
start = time.perf_counter()
"""
_REPORT = """
print(time.perf_counter() - start, status("VmHWM") - before, status("VmRSS") - before)
"""
ONNXRUNTIME = _PRELUDE + """
session = onnxruntime.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
session.run(None, feeds)
""" + _REPORT
PRISM = _PRELUDE + """
from runtime.devices import parse_devices
from runtime.host import HostManager
host = HostManager(parse_devices("cpu:2"))
host.add_network("mlp", sys.argv[1])
host.run("mlp", feeds).result()
""" + _REPORT


def _model(path: Path) -> int:
    """Write the MLP; returns its weights' bytes."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(LAYERS):
        weights.append(numpy_helper.from_array(
            rng.standard_normal((WIDTH, WIDTH), np.float32) / WIDTH ** 0.5, f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        x = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", WIDTH])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["n", WIDTH])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return LAYERS * WIDTH * WIDTH * 4


def _load(script: str, path: Path) -> tuple[float, int, int]:
    """(seconds to the first answer, peak bytes, bytes held after) of one new process."""
    done = subprocess.run([sys.executable, "-c", script, str(path), str(WIDTH)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=True)
    seconds, peak, held = done.stdout.split()
    return float(seconds), int(peak), int(held)


def run(quick: bool = False) -> list[dict]:
    if not Path("/proc/self/clear_refs").exists():
        return []  # the peak is read from Linux's /proc
    runs = 1 if quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mlp.onnx"
        weights = _model(path)
        measured: dict[str, list[tuple[float, int, int]]] = {"onnxruntime": [], "prism": []}
        for _ in range(runs):  # interleaved, so drift in the machine's load hits both
            measured["onnxruntime"].append(_load(ONNXRUNTIME, path))
            measured["prism"].append(_load(PRISM, path))
    (ort_s, ort_peak, ort_held), (our_s, our_peak, our_held) = (
        tuple(statistics.median(x) for x in zip(*v, strict=True)) for v in measured.values())
    mb = weights / 2**20

    def said(seconds: float, peak: float, held: float) -> str:
        return f"{seconds:.2f} s, peak {peak / weights:.2f}x, held {held / weights:.2f}x"

    detail = (f"{mb:.0f} MB of weights, medians of {runs} new processes each; memory as "
              f"multiples of the weights: onnxruntime {said(ort_s, ort_peak, ort_held)}; "
              f"prism on cpu:2 {said(our_s, our_peak, our_held)}")
    return [
        result(f"{mb:.0f} MB model, new process to first answer: prism cpu:2 / onnxruntime",
               our_s / ort_s, "x", "<= 4x", our_s / ort_s <= 4, detail),
        result(f"{mb:.0f} MB model, peak memory while loading: prism cpu:2 / onnxruntime",
               our_peak / ort_peak, "x", "<= 3x", our_peak / ort_peak <= 3, detail),
        result(f"{mb:.0f} MB model, memory held once loaded: prism cpu:2 / onnxruntime",
               our_held / ort_held, "x", "<= 2.2x", our_held / ort_held <= 2.2,
               "the graph's copy of the weights (plans, dashboards, re-planning) and the "
               "sessions'; onnxruntime holds its session's"),
    ]
