"""Cold start: a new process to its first answer, from a bundle and from the ONNX file.

gpt2 (tests/real_models) over 4 cpu devices, balanced. Each run is a fresh interpreter
that first imports numpy and onnxruntime (every path needs them) and loads the feeds;
the clock starts after that, so Prism's own imports count. Three paths:

- the host from the ONNX file: import the host, `HostManager.add_network` loads,
  partitions and provisions, then one run;
- the host from the bundle: the same calls with `gpt2.prism` (no partitioning);
- the standalone driver: `open_bundle` and one run.

A second figure: loading the four partitions in one warm process, stored as the bundle
stores them (onnxruntime's extended-optimized ONNX, weights in memory) against the
unoptimized sub-models and onnxruntime's ORT format, with their answers compared.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from benchmarks.common import result
from runtime.bundle.driver import load_stage
from runtime.bundle.plan_io import plan_from_dict
from runtime.bundle.reader import read_bundle
from runtime.bundle.writer import compile_bundle
from runtime.devices import parse_devices
from runtime.devices.ort.options import session_options
from runtime.graph import load_graph
from runtime.partition.submodel import extract
from runtime.stored import with_weights

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "real_models" / "gpt2.onnx"
FEEDS = ROOT / "tests" / "real_models" / "gpt2.inputs.npz"
DEVICES = "cpu:4"

_PRELUDE = """
import sys, time
import numpy, onnxruntime
feeds = dict(numpy.load(sys.argv[2]))
start = time.perf_counter()
"""
DRIVER = _PRELUDE + """
from runtime.driver import open_bundle
imported = time.perf_counter()
driver = open_bundle(sys.argv[1])
driver.run(feeds)
print(time.perf_counter() - start, imported - start)
"""
HOST = _PRELUDE + f"""
from runtime.devices import parse_devices
from runtime.host import HostManager
imported = time.perf_counter()
host = HostManager(parse_devices({DEVICES!r}))
host.add_network("gpt2", sys.argv[1], partition="balanced")
host.run("gpt2", feeds).result()
print(time.perf_counter() - start, imported - start)
"""


def _cold(script: str, source: Path) -> tuple[float, float]:
    """(seconds to the first answer, of which importing Prism's modules)."""
    done = subprocess.run([sys.executable, "-c", script, str(source), str(FEEDS)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=True)
    total, imports = map(float, done.stdout.split())
    return total, imports


def _best_load(make, repeats: int) -> tuple[float, ort.InferenceSession]:
    best, session = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        session = make()
        best = min(best, time.perf_counter() - start)
    return best, session


def _ort_format(raw: bytes, tmp: str) -> bytes:
    opts = session_options(1)
    opts.optimized_model_filepath = os.path.join(tmp, "p.ort")
    opts.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(raw, opts, providers=["CPUExecutionProvider"])
    return Path(opts.optimized_model_filepath).read_bytes()


def _load_ort_format(data: bytes) -> ort.InferenceSession:
    opts = session_options(1)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.add_session_config_entry("session.load_model_format", "ORT")
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def _formats(bundle_path: Path, repeats: int) -> dict[str, tuple[float, bool]]:
    """Per storage form: seconds to load every partition (each its best of `repeats`),
    and whether every partition answers exactly as its unoptimized sub-model does."""
    graph = load_graph(MODEL, name="gpt2")
    values = dict(np.load(FEEDS))
    forms: dict[str, list[tuple[float, bool]]] = {}
    with read_bundle(bundle_path) as bundle, tempfile.TemporaryDirectory() as tmp:
        parts = {p.name: p for p in plan_from_dict(bundle.json("plan.json")).partitions}
        for i, row in enumerate(bundle.manifest["schedule"]):
            # its weights in the bytes, as a sub-model stored on its own holds them (the
            # graph's are shells naming where they lie in gpt2.onnx)
            raw = with_weights(extract(graph, parts[row["partition"]])).SerializeToString()
            flat = _ort_format(raw, tmp)
            makers = {
                "sub-model": lambda raw=raw: ort.InferenceSession(
                    raw, session_options(1), providers=["CPUExecutionProvider"]),
                "bundle": lambda i=i, row=row: load_stage(bundle, i, row).session,
                "ORT format": lambda flat=flat: _load_ort_format(flat)}
            feeds = {t: values[t] for t in row["reads"]}
            want = None
            for form, make in makers.items():
                seconds, session = _best_load(make, repeats)
                got = dict(zip([o.name for o in session.get_outputs()],
                               session.run(None, feeds), strict=True))
                want = want or got
                forms.setdefault(form, []).append(
                    (seconds, all(np.array_equal(got[k], v) for k, v in want.items())))
            values.update(want)
    return {form: (sum(s for s, _ in loads), all(same for _, same in loads))
            for form, loads in forms.items()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


def run(quick: bool = False) -> list[dict]:
    runs = 3 if quick else 7
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "gpt2.prism"
        compile_bundle(MODEL, parse_devices(DEVICES), bundle, partition="balanced")
        paths = {"host, ONNX file": (HOST, MODEL), "host, bundle": (HOST, bundle),
                 "driver, bundle": (DRIVER, bundle)}
        cold: dict[str, list[tuple[float, float]]] = {k: [] for k in paths}
        for _ in range(runs):  # interleaved, so drift in the machine's load hits all
            for name, (script, source) in paths.items():
                cold[name].append(_cold(script, source))
        forms = _formats(bundle, 5 if quick else 20)
    medians = {k: tuple(statistics.median(x) for x in zip(*v, strict=True))
               for k, v in cold.items()}
    spread = {k: (min(t for t, _ in v), max(t for t, _ in v)) for k, v in cold.items()}
    (slow, slow_imports), (host, host_imports), (driver, driver_imports) = medians.values()

    def said(name: str) -> str:
        total, imports = medians[name]
        low, high = spread[name]
        return (f"{name} {_ms(total)} (imports {_ms(imports)}; {_ms(low)} to {_ms(high)})")

    detail = (f"medians of {runs} new processes each, after numpy and onnxruntime imports: "
              + "; ".join(said(k) for k in paths))
    ours, raw, flat = forms["bundle"], forms["sub-model"], forms["ORT format"]
    return [
        result("gpt2 on 4 cpu devices, cold start: host from ONNX file / host from bundle",
               slow / host, "x", ">= 5x (aim 10x)", slow / host >= 5, detail),
        result("gpt2 on 4 cpu devices, cold start: host from ONNX file / driver",
               slow / driver, "x", ">= 5x", slow / driver >= 5,
               f"driver {_ms(driver)} (imports {_ms(driver_imports)}), host from bundle "
               f"{_ms(host)} (imports {_ms(host_imports)}), host from ONNX file {_ms(slow)} "
               f"(imports {_ms(slow_imports)})"),
        result("gpt2, 4 partitions: load as stored in the bundle", ours[0] * 1e3, "ms",
               "bit-identical", ours[1] and flat[1],
               f"unoptimized sub-models {raw[0] * 1e3:.1f} ms, ORT format {flat[0] * 1e3:.1f} "
               f"ms (best of repeats, warm process); all answer alike: {ours[1] and flat[1]}"),
    ]
