"""How long `balanced` takes to split a random 10,000-node DAG into 8 stages, and `memory`
to place it on devices whose memory the nodes' bytes touched exceed (each fit is a walk
of the liveness, so filling must search for its end rather than step to it), and
`balanced` to cut it into regions for accelerators that run only a few of its ops."""

from __future__ import annotations

import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks.common import result
from runtime import load_graph, parse_devices
from runtime.graph import Graph
from runtime.partition import partition
from runtime.partition.plan import Plan

WIDTH = 32


def random_dag(n_nodes: int, seed: int = 0) -> onnx.ModelProto:
    """A chain-like DAG with skip edges, fan-out and shared weights, all [1, WIDTH]."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(
        rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.1, f"w{i}") for i in range(16)]
    nodes, unread = [], {"x"}
    tensors = ["x"]
    for i in range(n_nodes):
        a = tensors[max(0, len(tensors) - 1 - int(rng.geometric(0.5)) + 1)]
        b = tensors[max(0, len(tensors) - 1 - int(rng.integers(0, 40)))]
        out = f"t{i}"
        kind = rng.choice(["Add", "Mul", "Relu", "Sigmoid", "MatMul"], p=[.3, .2, .2, .1, .2])
        if kind in ("Add", "Mul"):
            nodes.append(helper.make_node(kind, [a, b], [out], name=f"n{i}"))
            unread -= {a, b}
        elif kind == "MatMul":
            w = weights[int(rng.integers(0, len(weights)))].name
            nodes.append(helper.make_node(kind, [a, w], [out], name=f"n{i}"))
            unread.discard(a)
        else:
            nodes.append(helper.make_node(kind, [a], [out], name=f"n{i}"))
            unread.discard(a)
        tensors.append(out)
        unread.add(out)
    outputs = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, WIDTH])
               for t in sorted(unread - {"x"})]
    graph = helper.make_graph(nodes, "random_dag",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
                              outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def run(quick: bool = False) -> list[dict]:
    n = 2_000 if quick else 10_000
    graph = load_graph(random_dag(n), name=f"random{n}")
    devices = parse_devices("cpu:8")
    times = []
    for _ in range(1 if quick else 3):
        start = time.perf_counter()
        plan = partition(graph, devices, "balanced")
        times.append(time.perf_counter() - start)
    assert len(plan.partitions) == 8 and sum(len(p.nodes) for p in plan.partitions) == n
    packed, packed_took = _timed(graph, "cpu:8:mem=1MB", "memory")
    mixed, mixed_took = _timed(graph, MIXED, "balanced")
    return [result(f"partition {n}-node DAG into 8 balanced stages", min(times), "s", "< 2 s",
                   min(times) < 2.0, f"best of {len(times)}; bottleneck "
                   f"{plan.bottleneck_seconds * 1e3:.3f} ms"),
            result(f"place {n}-node DAG in memory mode on cpu:8:mem=1MB", packed_took, "s",
                   "reported", True, f"{len(packed.partitions)} partition(s)"),
            result(f"balance {n}-node DAG on {MIXED}", mixed_took, "s", "reported", True,
                   f"{len(mixed.partitions)} partition(s); bottleneck "
                   f"{mixed.bottleneck_seconds * 1e3:.3f} ms")]


MIXED = "cpu:2,sim:4:ops=MatMul+Add"  # accelerators that run a few ops: regions


def _timed(graph: Graph, devices: str, mode: str) -> tuple[Plan, float]:
    start = time.perf_counter()
    plan = partition(graph, parse_devices(devices), mode)
    return plan, time.perf_counter() - start
