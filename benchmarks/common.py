"""Shared pieces of the benchmarks: timing loops and a one-op model."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 50) -> float:
    for _ in range(warmup):
        call()
    samples = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter()
        call()
        samples[i] = time.perf_counter() - start
    return float(np.median(samples))


def relu_model(width: int = 16) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def relu_mlp(width: int, layers: int, rng: np.random.Generator) -> onnx.ModelProto:
    """x [n, width] through `layers` MatMuls (weights w0, w1, ... scaled by 1/sqrt(width))
    each followed by a Relu (r0, r1, ...: the last is the output)."""
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        weights.append(numpy_helper.from_array(
            rng.standard_normal((width, width), np.float32) / width ** 0.5, f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"])]
        x = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["n", width])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def result(name: str, value: float, unit: str, target: str, ok: bool, detail: str) -> dict:
    return {"name": name, "value": value, "unit": unit, "target": target, "ok": ok,
            "detail": detail}
