"""Shared pieces of the benchmarks: timing loops and a one-op model."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper


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


def result(name: str, value: float, unit: str, target: str, ok: bool, detail: str) -> dict:
    return {"name": name, "value": value, "unit": unit, "target": target, "ok": ok,
            "detail": detail}
