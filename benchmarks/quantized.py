"""int8 over float through Prism: latency on one cpu device (1 thread), digits accuracy.

Each model is quantized by `prism quantize`'s defaults (onnxruntime's static quantizer:
QDQ, uint8 activations, int8 per-channel weights, MinMax on random calibration data)
and both versions run through a HostManager with one 1-thread cpu device, float and
int8 requests interleaved so machine noise hits both alike; the float baseline is the
same pre-processed model the quantizer started from.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.common import result
from benchmarks.digits import digits_classifier
from runtime import DeviceConfig
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.quantize import calibrate, check_samples
from runtime.quantize.search import run_outputs

MODELS = {"cnn": "sample_models/cnn.onnx", "transformer": "sample_models/transformer.onnx",
          "resnet": "tests/real_models/resnet.onnx"}
CONVOLUTIONAL = ("cnn", "resnet")


def _pair(path: str, batch: int, repeats: int) -> tuple[float, float]:
    """Median latency (float, int8) through Prism, 1 cpu device, 1 thread."""
    graph = load_graph(path)
    name = graph.inputs[0]
    rng = np.random.default_rng()
    shape = graph.tensors[name].shape[1:]
    data = rng.standard_normal((32, *shape)).astype(np.float32)
    with calibrate(path, check_samples({name: data}, graph, "random")) as c:
        models = {"float": c.prepared, "int8": c.quantize()}
    feeds = {name: rng.standard_normal((batch, *shape)).astype(np.float32)}
    samples = {k: np.empty(repeats) for k in models}
    with HostManager([DeviceConfig(name="cpu0", backend="cpu", threads=1)]) as host:
        for k, m in models.items():
            host.add_network(k, m, partition="balanced")
            for _ in range(20):
                host.run(k, feeds).result()
        for i in range(repeats):
            for k in models:
                start = time.perf_counter()
                host.run(k, feeds).result()
                samples[k][i] = time.perf_counter() - start
    return float(np.median(samples["float"])), float(np.median(samples["int8"]))


def run(quick: bool = False) -> list[dict]:
    repeats = 100 if quick else 400
    out = []
    for key, path in MODELS.items():
        for batch in (1, 8):
            plain, int8 = _pair(path, batch, repeats)
            ratio = plain / int8
            target = ">= 2x" if key in CONVOLUTIONAL else "reported"
            out.append(result(f"{key}, batch {batch}, 1 cpu thread: int8 speed-up over float",
                              ratio, "x", target, ratio >= 2 or key not in CONVOLUTIONAL,
                              f"float {plain * 1e6:.0f} us, int8 {int8 * 1e6:.0f} us "
                              f"(median of {repeats}, interleaved)"))
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
