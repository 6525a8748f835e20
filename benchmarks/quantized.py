"""int8 over float through Prism: latency on one cpu device (1 thread), digits accuracy.

Each model is quantized by `prism quantize`'s defaults (onnxruntime's static quantizer:
QDQ, uint8 activations, int8 per-channel weights, MinMax on random calibration data,
convolutions on fewer than 8 input channels kept in float) and both versions run through
a HostManager with one 1-thread cpu device, one request at a time as a user calls
`host.run(...).result()`; the float baseline is the same pre-processed model the
quantizer started from. The int8 model also runs in a plain onnxruntime session with
Prism's session options, so Prism's own cost on it shows. All runs are interleaved in a
shuffled order, so machine noise hits each alike; figures are medians (± half the
interquartile range). The transformer is also quantized in its MatMuls alone.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from benchmarks.common import result
from benchmarks.digits import digits_classifier
from runtime import DeviceConfig
from runtime.devices.ort.options import session_options
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.quantize import QuantizeOptions, calibrate, check_samples
from runtime.quantize.quantizer import quantizable_ops
from runtime.quantize.search import run_outputs

MODELS = {"cnn": "sample_models/cnn.onnx", "transformer": "sample_models/transformer.onnx",
          "resnet": "tests/real_models/resnet.onnx"}
CONVOLUTIONAL = ("cnn", "resnet")
MATMUL_ONLY = QuantizeOptions(exclude_ops=tuple(sorted(quantizable_ops() - {"MatMul"})))


def interleaved(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple]:
    """Median and half interquartile range (seconds) of each call, run in shuffled turns."""
    for call in calls.values():
        for _ in range(20):
            call()
    samples: dict[str, list[float]] = {k: [] for k in calls}
    order = list(calls)
    for _ in range(repeats):
        random.shuffle(order)
        for key in order:
            start = time.perf_counter()
            calls[key]()
            samples[key].append(time.perf_counter() - start)
    return {k: (float(np.median(v)), float(np.subtract(*np.percentile(v, [75, 25]))) / 2)
            for k, v in samples.items()}


def _latencies(path: str, batch: int, repeats: int, variants: dict[str, QuantizeOptions]
               ) -> dict[str, tuple]:
    """Prism float, Prism int8 per variant and plain onnxruntime int8 (the first variant)."""
    graph = load_graph(path)
    name = graph.inputs[0]
    rng = np.random.default_rng()
    shape = graph.tensors[name].shape[1:]
    data = rng.standard_normal((32, *shape)).astype(np.float32)
    with calibrate(path, check_samples({name: data}, graph, "random")) as c:
        models = {"float": c.prepared, **{k: c.quantize(o) for k, o in variants.items()}}
    feeds = {name: rng.standard_normal((batch, *shape)).astype(np.float32)}
    first = next(iter(variants))
    plain = ort.InferenceSession(models[first].SerializeToString(), session_options(1),
                                 providers=["CPUExecutionProvider"])
    with HostManager([DeviceConfig(name="cpu0", backend="cpu", threads=1)]) as host:
        for k, m in models.items():
            host.add_network(k, m, partition="balanced")
        calls = {k: (lambda k=k: host.run(k, feeds).result()) for k in models}
        calls["plain"] = lambda: plain.run(None, feeds)
        return interleaved(calls, repeats)


def _us(figure: tuple) -> str:
    return f"{figure[0] * 1e6:.0f} ± {figure[1] * 1e6:.0f} us"


def run(quick: bool = False) -> list[dict]:
    repeats = 100 if quick else 400
    out = []
    for key, path in MODELS.items():
        variants = {"int8": QuantizeOptions()}
        if key == "transformer":
            variants["matmul"] = MATMUL_ONLY
        for batch in (1, 8):
            t = _latencies(path, batch, repeats, variants)
            for variant in variants:
                ratio = t["float"][0] / t[variant][0]
                what = "int8" if variant == "int8" else "int8 in MatMuls only"
                target = ">= 2x" if key in CONVOLUTIONAL else "reported"
                extra = (f"; plain onnxruntime int8 {_us(t['plain'])}" if variant == "int8"
                         else "")
                out.append(result(f"{key}, batch {batch}, 1 cpu thread: {what} speed-up over "
                                  f"float", ratio, "x", target,
                                  ratio >= 2 or key not in CONVOLUTIONAL,
                                  f"Prism float {_us(t['float'])}, int8 {_us(t[variant])}"
                                  f"{extra} (median of {repeats}, interleaved)"))
    digits = digits_classifier()
    graph = load_graph(digits.model)
    test = check_samples({"pixels": digits.test_x}, graph, "test")
    with calibrate(digits.model, check_samples({"pixels": digits.train_x}, graph, "train")) as c:
        floats = digits.accuracy(run_outputs(c.prepared, test)["logits"])
        int8 = digits.accuracy(run_outputs(c.quantize(), test)["logits"])
    drop = (floats - int8) * 100
    out.append(result("digits MLP: float - int8 test accuracy", drop, "points", "<= 1",
                      drop <= 1, f"float {floats:.2%}, int8 {int8:.2%} on {len(digits.test_y)} "
                      f"test images"))
    return out
