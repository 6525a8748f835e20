"""Loading a large model: a new process to its first answer, and the memory it takes.

A 200 MB float MLP (twelve 2048x2048 MatMuls with Relu, weights inside the file, then in
an external data file), in
fresh interpreters that first import numpy and onnxruntime: plain onnxruntime (a session
from the file, one run) against `HostManager.add_network` on `cpu:2` with default
settings (one run), its first load (which measures the network's costs) and a later one
(costs cached). Per process: seconds to the answer, its peak resident memory, and what
it holds once loaded, each less the memory before the load. Ratios against
onnxruntime measured the same way, in the same run (docs/performance.md, "Loading
large models").
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from benchmarks.common import relu_mlp, result

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


def _load(script: str, path: Path, cache: str) -> tuple[float, int, int]:
    """(seconds to the first answer, peak bytes, bytes held after) of one new process,
    Prism's cost cache in `cache`."""
    done = subprocess.run([sys.executable, "-c", script, str(path), str(WIDTH)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=True,
                          env={**os.environ, "PRISM_CACHE_DIR": cache})
    seconds, peak, held = done.stdout.split()
    return float(seconds), int(peak), int(held)


def _medians(path: Path, runs: int) -> dict[str, tuple[float, float, float]]:
    """onnxruntime, Prism's first load and a later one of the model at `path`: the medians
    of `runs` new processes each, interleaved so drift in the machine's load hits all."""
    measured: dict[str, list[tuple[float, int, int]]] = {"onnxruntime": [], "first": [],
                                                         "later": []}
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:  # the first load measures costs
            for name, script in (("onnxruntime", ONNXRUNTIME), ("first", PRISM),
                                 ("later", PRISM)):
                measured[name].append(_load(script, path, cache))
    return {name: tuple(statistics.median(x) for x in zip(*v, strict=True))
            for name, v in measured.items()}


def run(quick: bool = False) -> list[dict]:
    if not Path("/proc/self/clear_refs").exists():
        return []  # the peak is read from Linux's /proc
    runs = 1 if quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        model = relu_mlp(WIDTH, LAYERS, np.random.default_rng(0))
        onnx.save(model, Path(tmp) / "mlp.onnx")
        onnx.save(model, Path(tmp) / "external.onnx", save_as_external_data=True,
                  location="external.data")
        one_file, external = (_medians(Path(tmp) / name, runs)
                              for name in ("mlp.onnx", "external.onnx"))
    (ort_s, ort_peak, ort_held), (first_s, first_peak, _), (later_s, later_peak, held) = \
        one_file.values()
    (ext_ort_s, _, ext_ort_held), _, (ext_s, _, ext_held) = external.values()
    weights = LAYERS * WIDTH * WIDTH * 4
    mb = weights / 2**20

    def said(seconds: float, peak: float) -> str:
        return f"{seconds:.2f} s, peak {peak / weights:.2f}x"

    detail = (f"{mb:.0f} MB of weights, medians of {runs} new processes each; memory as "
              f"multiples of the weights: onnxruntime {said(ort_s, ort_peak)}, held "
              f"{ort_held / weights:.2f}x; prism on cpu:2, first load (measuring its costs) "
              f"{said(first_s, first_peak)}, a later one {said(later_s, later_peak)}, held "
              f"{held / weights:.2f}x")
    ext_detail = (f"{mb:.0f} MB of weights in an external data file, medians of {runs} new "
                  f"processes each: onnxruntime {ext_ort_s:.2f} s, held "
                  f"{ext_ort_held / weights:.2f}x the weights; prism on cpu:2, a later load "
                  f"{ext_s:.2f} s, held {ext_held / weights:.2f}x")
    peak = max(first_peak, later_peak)
    return [
        _at_most(f"{mb:.0f} MB model, new process to first answer, costs cached: prism cpu:2 "
                 f"/ onnxruntime", later_s / ort_s, 4, detail),
        _at_most(f"{mb:.0f} MB model, new process to first answer, first load (measures "
                 f"its costs): prism cpu:2 / onnxruntime", first_s / ort_s, 15, detail),
        _at_most(f"{mb:.0f} MB model, peak memory while loading: prism cpu:2 / onnxruntime",
                 peak / ort_peak, 3, detail),
        _at_most(f"{mb:.0f} MB model, memory held once loaded: prism cpu:2 / onnxruntime",
                 held / ort_held, 1.3, "the sessions' copy of the weights (the graph's stay "
                 "in the file); onnxruntime holds its session's"),
        _at_most(f"{mb:.0f} MB model with external data, new process to first answer, costs "
                 f"cached: prism cpu:2 / onnxruntime", ext_s / ext_ort_s, 4, ext_detail),
        _at_most(f"{mb:.0f} MB model with external data, memory held once loaded: prism "
                 f"cpu:2 / onnxruntime", ext_held / ext_ort_held, 1.3, ext_detail),
    ]


def _at_most(name: str, ratio: float, bar: float, detail: str) -> dict:
    """A ratio against onnxruntime and its bar."""
    return result(name, ratio, "x", f"<= {bar:g}x", ratio <= bar, detail)
