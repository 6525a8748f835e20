"""Test helpers: random ONNX DAGs, random device lists, and independent reference figures.

Nothing here imports the partitioner's own helpers: the reference time, memory and
feasibility below are written from the documented semantics, so they can catch it out.
Only the graph API (`Graph`, `Node`, `tensor_bytes`) and the cost model's public
functions (`node_cost`, `device_seconds`, `link_seconds`, `send_seconds`) are used.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from runtime.cost import device_seconds, link_seconds, node_cost, send_seconds
from runtime.devices.config import DeviceConfig
from runtime.graph import Graph, Node, load_graph

SAMPLES_DIR = Path(__file__).resolve().parents[2] / "sample_models"
SAMPLE_NAMES = ("mlp", "cnn", "transformer", "branchy", "control_flow")


@functools.cache
def sample_graph(name: str) -> Graph:
    """A sample model, loaded once per session (callers must not mutate it)."""
    return load_graph(SAMPLES_DIR / f"{name}.onnx")


UNARY_OPS = ("Relu", "Sigmoid", "Tanh", "Neg", "Softmax", "Abs")
BINARY_OPS = ("Add", "Mul", "Sub", "Max")


# --------------------------------------------------------------------------------------
# Randomness that works with a seed, a numpy Generator, random.Random or hypothesis' draw
# --------------------------------------------------------------------------------------
class Rand:
    """A small random source over either a PRNG or a hypothesis `draw` function."""

    def __init__(self, source: Any):
        self.draw: Callable | None = None
        self.rng: np.random.Generator | random.Random | None = None
        if isinstance(source, Rand):
            self.draw, self.rng = source.draw, source.rng
        elif isinstance(source, np.random.Generator | random.Random):
            self.rng = source
        elif isinstance(source, int):
            self.rng = np.random.default_rng(source)
        elif callable(source):
            self.draw = source
        else:
            raise TypeError(f"need a seed, a Generator, a Random or a draw, got {source!r}")

    def int(self, lo: int, hi: int) -> int:
        """A uniform integer in [lo, hi] (both ends included)."""
        if lo >= hi:
            return lo
        if self.draw is not None:
            return self.draw(st.integers(lo, hi))
        if isinstance(self.rng, random.Random):
            return self.rng.randint(lo, hi)
        return int(self.rng.integers(lo, hi + 1))

    def choice(self, seq: Sequence):
        return seq[self.int(0, len(seq) - 1)]

    def chance(self, p: float) -> bool:
        """True with probability about p; hypothesis shrinks it towards False."""
        return self.int(0, 999) >= round((1 - p) * 1000)

    def shuffled(self, seq: Sequence) -> list:
        items = list(seq)
        for i in range(len(items) - 1, 0, -1):  # Fisher-Yates, so `draw` can drive it
            j = self.int(0, i)
            items[i], items[j] = items[j], items[i]
        return items


# --------------------------------------------------------------------------------------
# Random DAG models
# --------------------------------------------------------------------------------------
def random_dag_model(source: Any, n_nodes: int, *, max_width: int = 48,
                     batch: int | str | None = None, n_outputs: int | None = None,
                     name: str = "random_dag") -> onnx.ModelProto:
    """A checked ONNX model: a random DAG of exactly `n_nodes` float32 nodes.

    Tensors are all [batch, width] (batch 1 or the symbol `batch`). Nodes read one or two
    earlier tensors, near or far back; MatMul weights and Add biases are sometimes shared
    by two nodes; a Concat is often followed by a MatMul that brings the width back; a
    Split makes two outputs; an If (after ReduceSum and Greater) reads earlier tensors
    from its branches only (outer-scope reads).
    Every node output is read by a later node or is a graph output (1 or 2 of them; a
    graph output may also be read inside the graph).
    """
    if n_nodes < 1:
        raise ValueError("n_nodes must be >= 1")
    r = Rand(source)
    if batch is None:
        batch = r.choice((1, "batch"))
    if n_outputs is None:
        n_outputs = r.int(1, 2)
    palette = sorted({r.int(2, max_width) for _ in range(r.int(2, 4))})
    width: dict[str, int] = {"x": r.choice(palette)}
    available = ["x"]  # every tensor a node may read, oldest first
    unconsumed: list[str] = []  # node outputs nobody reads yet, oldest first
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, onnx.TensorProto] = {}
    weights_from: dict[int, list[str]] = {}  # input width -> MatMul weights
    biases: dict[int, list[str]] = {}

    def read(t: str) -> str:
        if t in unconsumed:
            unconsumed.remove(t)
        return t

    def emit(op: str, inputs: Sequence[str], out_width: int, *, outputs: int = 1,
             track: bool = True, **attrs: object) -> str:
        """Add a node; returns its (first) output. Untracked outputs (scalars, bools)
        are never picked as inputs or graph outputs: the caller consumes them."""
        i = len(nodes)
        outs = [f"t{i}"] if outputs == 1 else [f"t{i}_{k}" for k in range(outputs)]
        nodes.append(helper.make_node(op, [read(t) for t in inputs], outs,
                                      name=f"n{i}_{op.lower()}", **attrs))
        for out in outs:
            width[out] = out_width
            if track:
                available.append(out)
                unconsumed.append(out)
        return outs[0]

    def init(shape: tuple[int, ...]) -> str:
        tname = f"w{len(inits)}"
        value = np.full(shape, 0.01 * (len(inits) + 1), dtype=np.float32)
        inits[tname] = numpy_helper.from_array(value, tname)
        return tname

    def pick() -> str:
        """An earlier tensor: usually recent, sometimes far back (skip edges)."""
        if unconsumed and r.chance(0.6):
            return r.choice(unconsumed)
        if r.chance(0.3):
            return r.choice(available)
        back = r.int(0, min(3, len(available) - 1))
        return available[len(available) - 1 - back]

    def matmul(a: str, out_width: int | None = None) -> str:
        w_in = width[a]
        shared = [w for w in weights_from.get(w_in, ())
                  if out_width is None or inits[w].dims[1] == out_width]
        if shared and r.chance(0.5):
            w = r.choice(shared)
        else:
            w = init((w_in, out_width or r.choice(palette)))
            weights_from.setdefault(w_in, []).append(w)
        return emit("MatMul", [a, w], int(inits[w].dims[1]))

    def unary(a: str) -> str:
        op = r.choice(UNARY_OPS)
        return emit(op, [a], width[a], **({"axis": -1} if op == "Softmax" else {}))

    def binary(a: str, b: str | None = None) -> str:
        if b is None:
            partners = [t for t in available if width[t] == width[a] and t != a]
            if partners:
                b = r.choice(partners)
        if b is None:  # no partner: add a (maybe shared) bias
            pool = biases.setdefault(width[a], [])
            if pool and r.chance(0.5):
                b = r.choice(pool)
            else:
                b = init((width[a],))
                pool.append(b)
        return emit(r.choice(BINARY_OPS), [a, b], width[a])

    def merge(a: str, b: str, pair: bool) -> str:
        if width[a] == width[b]:
            return binary(a, b)
        cat = emit("Concat", [a, b], width[a] + width[b], axis=-1)
        return matmul(cat, r.choice((width[a], width[b]))) if pair else cat

    def split(a: str) -> str:
        """Split into two halves: one node, two outputs."""
        return emit("Split", [a], width[a] // 2, outputs=2, axis=-1)

    def if_block(a: str) -> str:
        """ReduceSum -> Greater -> If whose branches read earlier tensors from outside."""
        total = emit("ReduceSum", [a], 0, track=False, keepdims=0)
        if "zero" not in inits:
            inits["zero"] = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
        cond = emit("Greater", [total, "zero"], 0, track=False)
        b = pick()
        partners = [t for t in available if width[t] == width[b] and t != b]
        c = r.choice(partners) if partners else init((width[b],))
        i = len(nodes)
        out_type = [batch, width[b]]
        then = helper.make_graph(
            [helper.make_node("Relu", [b], [f"if{i}_then"], name=f"n{i}_if/then/relu")],
            f"then{i}", [], [helper.make_tensor_value_info(f"if{i}_then", TensorProto.FLOAT,
                                                           out_type)])
        other = helper.make_graph(
            [helper.make_node("Mul", [b, c], [f"if{i}_else"], name=f"n{i}_if/else/mul")],
            f"else{i}", [], [helper.make_tensor_value_info(f"if{i}_else", TensorProto.FLOAT,
                                                           out_type)])
        read(b)
        read(c)
        return emit("If", [cond], width[b], then_branch=then, else_branch=other)

    while len(nodes) < n_nodes:
        left = n_nodes - len(nodes)
        excess = len(unconsumed) - n_outputs
        forced = excess >= left - 1
        if not nodes:
            a = "x"
        elif forced and len(unconsumed) >= 2:
            i, j = sorted(r.shuffled(range(len(unconsumed)))[:2])
            merge(unconsumed[i], unconsumed[j], pair=left >= 2 and excess <= left - 1)
            continue
        elif forced:
            a = unconsumed[0]
        else:
            a = pick()
        kind = r.int(0, 11)
        if kind <= 2:
            unary(a)
        elif kind <= 4:
            matmul(a)
        elif kind <= 7 or forced:
            binary(a)
        elif kind <= 9 and left >= 2 and excess + 1 <= left - 2:
            b = pick()
            cat = emit("Concat", [a, b], width[a] + width[b], axis=-1)
            matmul(cat, r.choice((width[a], width[b])))
        elif kind == 10 and width[a] % 2 == 0 and excess + 2 <= left - 1:
            split(a)
        elif kind == 11 and left >= 3 and excess + 1 <= left - 3:
            if_block(a)
        else:
            binary(a)

    outputs = list(unconsumed)
    if len(outputs) < n_outputs:  # a graph output that is also read inside the graph
        inner = [t for t in available[1:] if t not in outputs]
        if inner:
            outputs.append(r.choice(inner))
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width["x"]])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [batch, width[t]]) for t in outputs],
        initializer=list(inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="prism-tests")
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


@st.composite
def dag_models(draw, min_nodes: int = 5, max_nodes: int = 40, max_width: int = 48):
    """Hypothesis strategy: a random DAG model (an onnx.ModelProto)."""
    n = draw(st.integers(min_nodes, max_nodes))
    return random_dag_model(draw, n, max_width=max_width)


# --------------------------------------------------------------------------------------
# Random device lists
# --------------------------------------------------------------------------------------
MEMORY_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 2.0)


def random_devices(source: Any, scale: int, *, min_devices: int = 1, max_devices: int = 8,
                   ops: Sequence[str] = (), tight: bool = True, floor: int = 0
                   ) -> list[DeviceConfig]:
    """1..8 devices mixing cpu and sim, uniquely named `<backend><i>`.

    `scale` is about the model's total bytes; memory is drawn as a fraction of it (so it
    often binds) or left at the backend default. `floor` (the most memory one node needs
    alone), when given, sizes devices that just hold the biggest node. Figures come from
    small palettes, so identical devices (equal but for the name) are common. A sim
    device sometimes lacks one of `ops`.
    """
    r = Rand(source)
    count = r.int(min_devices, max_devices)
    # 0: memory mostly at the (roomy) defaults; 1: mixed; 2: every device tight.
    regime = r.int(0, 2) if tight else 0
    devices = []
    for _ in range(count):
        backend = r.choice(("cpu", "sim"))
        kw: dict[str, Any] = {}
        if regime == 2 and floor and r.chance(0.6):
            kw["memory_bytes"] = int(floor * r.choice((1.0, 1.1, 1.5, 2.0, 3.0)))
        elif regime == 2:
            kw["memory_bytes"] = max(1, int(scale * r.choice(MEMORY_FRACTIONS[:6])))
        elif r.chance(0.2 if regime == 0 else 0.75):
            kw["memory_bytes"] = max(1, int(scale * r.choice(MEMORY_FRACTIONS)))
        if backend == "cpu":
            if r.chance(0.3):
                kw["threads"] = r.int(1, 4)
        else:
            if r.chance(0.6):
                kw["peak_flops"] = r.choice((1e9, 5e10, 2e12))
            if r.chance(0.6):
                kw["link_bandwidth"] = r.choice((2e8, 1e9, 12e9))
            if ops and r.chance(0.25):
                kw["supported_ops"] = frozenset(ops) - {r.choice(sorted(set(ops)))}
        taken = sum(d.backend == backend for d in devices)
        devices.append(DeviceConfig(name=f"{backend}{taken}", backend=backend, **kw))
    return devices


@st.composite
def device_lists(draw, scale: int, min_devices: int = 1, max_devices: int = 8,
                 ops: Sequence[str] = (), floor: int = 0):
    return random_devices(draw, scale, min_devices=min_devices, max_devices=max_devices,
                          ops=ops, floor=floor)


# --------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------
def collect(gen: Iterator) -> tuple[list, Any]:
    """Run a step generator to the end: (every yielded step, the returned value)."""
    steps = []
    while True:
        try:
            steps.append(next(gen))
        except StopIteration as stop:
            return steps, stop.value


# --------------------------------------------------------------------------------------
# Independent reference semantics
# --------------------------------------------------------------------------------------
def reads_of(node: Node) -> list[str]:
    """Explicit inputs then outer-scope tensors, each once, empty names dropped."""
    out: list[str] = []
    for t in (*node.inputs, *node.outer_inputs):
        if t and t not in out:
            out.append(t)
    return out


def producers(graph: Graph) -> dict[str, str]:
    return {t: n.name for n in graph.nodes for t in n.outputs if t}


def consumer_names(graph: Graph) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for n in graph.nodes:
        for t in reads_of(n):
            out.setdefault(t, set()).add(n.name)
    return out


def distinct_orderings(devices: Sequence[DeviceConfig], m: int | None = None
                       ) -> Iterator[tuple[DeviceConfig, ...]]:
    """Every sequence of the devices (or of m of them) but twins' swaps: a device's name
    changes nothing a split depends on, and eight alike devices have 40,320 orders."""
    seen = set()
    for perm in itertools.permutations(devices, m):
        kind = tuple(replace(d, name="twin") for d in perm)
        if kind not in seen:
            seen.add(kind)
            yield perm


class Reference:
    """Time, memory and feasibility of node groups, straight from the definitions."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.made_by = producers(graph)
        self.readers = consumer_names(graph)
        self.weights = set(graph.initializers)
        self.outputs = set(graph.outputs)
        self._cost = {n.name: node_cost(graph, n) for n in graph.nodes}

    def size(self, t: str) -> int:
        return self.graph.tensor_bytes(t)

    def incoming(self, names: Sequence[str]) -> set[str]:
        inside = set(names)
        return {t for n in names for t in reads_of(self.graph.node(n))
                if t in self.made_by and self.made_by[t] not in inside}

    def outgoing(self, names: Sequence[str]) -> set[str]:
        inside = set(names)
        return {t for n in names for t in self.graph.node(n).outputs
                if t and self.readers.get(t, set()) - inside}

    def seconds(self, names: Sequence[str], device: DeviceConfig) -> float:
        """Compute plus the device's own end of each copy: one in per activation it reads
        that others made, one out per activation it makes that others read."""
        if not names:
            return 0.0
        compute = sum(device_seconds(self._cost[n], device) for n in names)
        return compute + sum(link_seconds(self.size(t), device) for t in self.incoming(names)) \
            + sum(send_seconds(self.size(t), device) for t in self.outgoing(names))

    def weight_bytes(self, names: Sequence[str]) -> int:
        used = {t for n in names for t in reads_of(self.graph.node(n)) if t in self.weights}
        return sum(self.size(t) for t in used)

    def activation_bytes(self, names: Sequence[str]) -> int:
        """Peak live activations running `names` in the given order."""
        if not names:
            return 0
        inside = set(names)
        last = len(names) - 1
        position = {n: i for i, n in enumerate(names)}
        span: dict[str, tuple[int, int]] = {}
        for step, n in enumerate(names):
            node = self.graph.node(n)
            for t in reads_of(node):
                if t in self.weights:
                    continue
                # Made here: live from its producer on; read from outside: from the start.
                made_here = self.made_by.get(t) in inside
                first = position[self.made_by[t]] if made_here else 0
                span[t] = (first, max(step, span.get(t, (0, 0))[1]))
            for t in node.outputs:
                if not t:
                    continue
                leaves = t in self.outputs or bool(self.readers.get(t, set()) - inside)
                end = last if leaves else max(step, span.get(t, (0, step))[1])
                span[t] = (step, end)
        start = {t: s for t, (s, _) in span.items()}
        stop = {t: e for t, (_, e) in span.items()}
        live = [0] * len(names)
        for t, s in start.items():
            for step in range(s, stop[t] + 1):
                live[step] += self.size(t)
        return max(live)

    def memory(self, names: Sequence[str]) -> int:
        return self.weight_bytes(names) + self.activation_bytes(names)

    def runs(self, names: Sequence[str], device: DeviceConfig) -> bool:
        """Every node's op, and every op its subgraphs run, is in the device's list."""
        nodes = [self.graph.node(n) for n in names]
        return all(device.can_run(op) for node in nodes
                   for op in (node.op_type, *(op for _, op in node.body_ops)))

    def fits(self, names: Sequence[str], device: DeviceConfig) -> bool:
        return self.runs(names, device) and self.memory(names) <= device.memory_bytes

    def lone_misfits(self, devices: Sequence[DeviceConfig]) -> list[str]:
        """Nodes that, alone, fit or run on no device."""
        return [n.name for n in self.graph.nodes
                if not any(self.fits([n.name], d) for d in devices)]

    def feasible(self, order: Sequence[str], devices: Sequence[DeviceConfig]) -> bool:
        """Can `order` be cut into contiguous segments, one per device in sequence?

        Fill each device as far as it goes: exact, because a segment that fits still
        fits with nodes removed at either end.
        """
        a = 0
        for d in devices:
            b = a
            while b < len(order) and self.fits(order[a:b + 1], d):
                b += 1
            a = b
        return a == len(order)

    def fewest(self, order: Sequence[str], devices: Sequence[DeviceConfig]) -> int | None:
        """The fewest devices, in any sequence, whose segments cover `order`; None if none."""
        for m in range(1, len(devices) + 1):
            if any(self.feasible(order, perm) for perm in distinct_orderings(devices, m)):
                return m
        return None

    def split_bottleneck(self, order: Sequence[str], bounds: Sequence[int],
                         devices: Sequence[DeviceConfig]) -> float:
        return max((self.seconds(order[a:b], d)
                    for a, b, d in zip(bounds[:-1], bounds[1:], devices, strict=True)),
                   default=0.0)

    def segment_table(self, order: Sequence[str], devices: Sequence[DeviceConfig]
                      ) -> list[dict[tuple[int, int], float]]:
        """Per device: (a, b) -> seconds for every segment that fits and runs there."""
        n = len(order)
        tables: list[dict[tuple[int, int], float]] = []
        by_kind: dict[tuple, dict[tuple[int, int], float]] = {}
        for d in devices:
            key = tuple(sorted((k, str(v)) for k, v in d.to_dict().items() if k != "name"))
            if key not in by_kind:
                table = {}
                for a in range(n + 1):
                    table[a, a] = 0.0
                    for b in range(a + 1, n + 1):
                        if not self.fits(order[a:b], d):
                            break  # a longer segment does not fit either
                        table[a, b] = self.seconds(order[a:b], d)
                by_kind[key] = table
            tables.append(by_kind[key])
        return tables

    def brute_force(self, order: Sequence[str], devices: Sequence[DeviceConfig]
                    ) -> float | None:
        """Least bottleneck over every split of `order` into len(devices) contiguous
        (possibly empty) segments on `devices` in sequence; None if none fits."""
        n, k = len(order), len(devices)
        tables = self.segment_table(order, devices)
        best = None
        for cuts in itertools.combinations_with_replacement(range(n + 1), k - 1):
            bounds = (0, *cuts, n)
            worst = 0.0
            for j in range(k):
                t = tables[j].get((bounds[j], bounds[j + 1]))
                if t is None:
                    break
                worst = max(worst, t)
            else:
                if best is None or worst < best:
                    best = worst
        return best

    def any_sequence(self, order: Sequence[str], devices: Sequence[DeviceConfig], *,
                     brute: bool = True) -> float | None:
        """The least bottleneck over every sequence of the devices: `brute_force` (or
        `exact_dp`) on each of their distinct orderings, twins counted once."""
        found = [t for t in ((self.brute_force if brute else self.exact_dp)(order, perm)
                             for perm in distinct_orderings(devices)) if t is not None]
        return min(found, default=None)

    def exact_dp(self, order: Sequence[str], devices: Sequence[DeviceConfig]) -> float | None:
        """The same minimum as `brute_force`, by the plain O(k n^2) recurrence."""
        n = len(order)
        tables = self.segment_table(order, devices)
        inf = float("inf")
        best = [0.0] + [inf] * n  # best[b]: first b nodes on the devices so far
        for table in tables:
            new = [inf] * (n + 1)
            for (a, b), t in table.items():
                if best[a] < inf:
                    new[b] = min(new[b], max(best[a], t))
            best = new
        return None if best[n] == inf else best[n]


def matmul_chain(width: int, blocks: int, seed: int, *, lead: bool = False) -> onnx.ModelProto:
    """x -> [MatMul] -> Sigmoid -> (MatMul -> Relu) x blocks -> Softmax, random weights of
    width x width: nodes of three kinds, for placements that must interleave devices."""
    rng = np.random.default_rng(seed)
    nodes, weights, x = [], [], "x"

    def matmul(name: str, x: str, out: str) -> None:
        weights.append(numpy_helper.from_array(
            rng.standard_normal((width, width)).astype(np.float32), f"{name}.w"))
        nodes.append(helper.make_node("MatMul", [x, f"{name}.w"], [out], name=name))

    if lead:
        matmul("lead", "x", "led")
        x = "led"
    nodes.append(helper.make_node("Sigmoid", [x], ["h0"], name="stem"))
    for i in range(blocks):
        matmul(f"mm{i}", f"h{i}", f"m{i}")
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"h{i + 1}"], name=f"relu{i}"))
    nodes.append(helper.make_node("Softmax", [f"h{blocks}"], ["y"], name="head"))
    io = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [8, width]) for t in ("x", "y")]
    return helper.make_model(helper.make_graph(nodes, "chain", io[:1], io[1:], weights))


def biggest_node(graph: Graph) -> int:
    """The most memory any one node needs alone."""
    ref = Reference(graph)
    return max((ref.memory([n.name]) for n in graph.nodes), default=0)


def total_bytes(graph: Graph) -> int:
    """Weights plus every tensor a node makes: the model's memory if nothing were freed."""
    made = {t for n in graph.nodes for t in n.outputs if t}
    return sum(graph.tensor_bytes(t) for t in {*graph.initializers, *made, *graph.inputs})


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    """Equal up to float summation order."""
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


def order_of(graph, devices, mode: str) -> list[str]:
    """The order a failing partitioning run split along (model order if it failed before
    choosing one, e.g. in placement)."""
    from runtime.partition import partition_steps

    order = [n.name for n in graph.nodes]
    try:
        for step in partition_steps(graph, devices, mode):
            if step.kind == "order":
                order = list(step.nodes)
    except Exception:
        pass
    return order


def upsampling_detector(dims: Sequence[int | str | None], seed: int = 0) -> onnx.ModelProto:
    """A detector's neck in small, on an NCHW image of `dims` (3 channels; or CHW, one image,
    as torchvision's detectors take it): features at half the side, upsampled and joined to
    full-side features along the channels, as YOLO's necks join theirs. At a side of 1 the
    two no longer line up and the Concat fails."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("down.w", (8, 3, 3, 3)), ("side.w", (8, 3, 1, 1)))]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    batch = numpy_helper.from_array(np.array([0], np.int64), "batch")
    seen = "image" if len(dims) == 4 else "batched"
    nodes = [helper.make_node("Conv", [seen, "down.w"], ["down"], name="down", strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["down", "", "scales"], ["up"], name="up",
                              mode="nearest"),
             helper.make_node("Conv", [seen, "side.w"], ["side"], name="side"),
             helper.make_node("Concat", ["up", "side"], ["joined"], name="join", axis=1)]
    if len(dims) == 3:
        nodes.insert(0, helper.make_node("Unsqueeze", ["image", "batch"], [seen], name="one"))
    graph = helper.make_graph(
        nodes, "neck", [helper.make_tensor_value_info("image", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("joined", TensorProto.FLOAT, None)],
        [*weights, scales, batch])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def speech_frontend(dims: Sequence[int | str | None], seed: int = 0) -> onnx.ModelProto:
    """wav2vec2's feature encoder in small, on a waveform of `dims` ([batch, samples]): two
    strided 1-D convolutions (kernels 10 and 3), averaged over time. Under 10 samples the
    first convolution's kernel outgrows its input."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("conv0.w", (4, 1, 10)), ("conv1.w", (4, 4, 3)))]
    axes = [numpy_helper.from_array(np.array(a, np.int64), n) for n, a in (("one", [1]),
                                                                          ("last", [2]))]
    nodes = [helper.make_node("Unsqueeze", ["waveform", "one"], ["channel"], name="channel"),
             helper.make_node("Conv", ["channel", "conv0.w"], ["c0"], name="conv0", strides=[5]),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "conv1.w"], ["c1"], name="conv1", strides=[2]),
             helper.make_node("ReduceMean", ["c1", "last"], ["features"], name="mean",
                              keepdims=0)]
    graph = helper.make_graph(
        nodes, "speech",
        [helper.make_tensor_value_info("waveform", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, None)], [*weights, *axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def video_stem(dims: Sequence[int | str | None], frames_first: bool = False, seed: int = 0
               ) -> onnx.ModelProto:
    """A video network's stem in small, on a clip of `dims`: [N, C, T, H, W] (torchvision's
    layout) or, `frames_first`, [N, T, C, H, W] (transformers'), moved to the former; a
    3-D convolution over 2 frames and 16x16 patches (VideoMAE's tubelets), averaged. Under
    2 frames or 16 pixels its kernel outgrows the clip."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.standard_normal((8, 3, 2, 16, 16)).astype(np.float32),
                                     "tubelet.w")
    axes = numpy_helper.from_array(np.array([2, 3, 4], np.int64), "axes")
    nodes = [helper.make_node("Conv", ["channels_first", "tubelet.w"], ["patches"],
                              name="tubelet", strides=[2, 16, 16]),
             helper.make_node("ReduceMean", ["patches", "axes"], ["features"], name="mean",
                              keepdims=0)]
    if frames_first:
        nodes.insert(0, helper.make_node("Transpose", ["clip"], ["channels_first"],
                                         name="to_nctwh", perm=[0, 2, 1, 3, 4]))
    else:
        nodes[0].input[0] = "clip"
    graph = helper.make_graph(
        nodes, "video", [helper.make_tensor_value_info("clip", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, None)], [weight, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def vit_stem(dims: Sequence[int | str | None], patch: int, grid: int, extra: int,
             frames: int = 0, seed: int = 0, frame_by_frame: str = "") -> onnx.ModelProto:
    """A vision transformer's stem on images of `dims`, [N, C, H, W] or, with 3 channels
    last, [N, H, W, C], or with `frames` on clips of [N, T, C, H, W] (transformers' layout),
    each moved to channels second: 8-wide patches of `patch` pixels (2 frames deep in a
    clip), flattened to tokens, `extra` more (class tokens, here zeros) put in front, and a
    position embedding for `grid` x `grid` patches (by `frames` / 2) added: at any other
    side, or length, the Add fails. `frame_by_frame` patches a clip's frames one at a
    time (TimeSformer's), reshaped to [N * T, C, H, W] by a shape joined from the clip's
    own sides, as a dynamo export slices them ("sliced") or a TorchScript one gathers them
    ("gathered")."""
    rng = np.random.default_rng(seed)
    kernel = [2, patch, patch] if frames and not frame_by_frame else [patch, patch]
    tokens = grid * grid * max(frames // 2 if not frame_by_frame else 1, 1) + extra
    consts = [numpy_helper.from_array(rng.standard_normal((8, 3, *kernel)).astype(
                  np.float32), "patch.w"),
              numpy_helper.from_array(np.array([0, 8, -1], np.int64), "flat"),
              numpy_helper.from_array(np.array([0, extra, 0, 0, 0, 0], np.int64), "front"),
              numpy_helper.from_array(rng.standard_normal((1, tokens, 8)).astype(np.float32),
                                      "position")]
    nodes = [helper.make_node("Conv", ["channels_second", "patch.w"], ["patches"],
                              name="patchify", kernel_shape=kernel, strides=kernel),
             helper.make_node("Reshape", ["patches", "flat"], ["flat_patches"], name="flatten"),
             helper.make_node("Transpose", ["flat_patches"], ["patch_tokens"], name="tokens",
                              perm=[0, 2, 1]),
             helper.make_node("Pad", ["patch_tokens", "front"], ["all_tokens"], name="cls"),
             helper.make_node("Add", ["all_tokens", "position"], ["embedded"], name="embed"),
             helper.make_node("ReduceMean", ["embedded"], ["pooled"], name="pool", axes=[1])]
    perm = [0, 2, 1, 3, 4] if frames else [0, 3, 1, 2] if dims[-1] == 3 else None
    if frame_by_frame:
        consts += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (
            ("frames_and_channels", [-1, 3]), ("at_height", 3), ("at_width", 4), ("axis0", [0]))]
        sides = [helper.make_node("Shape", ["pixels"], [f"{s}_slice"], start=a, end=a + 1)
                 for s, a in (("height", 3), ("width", 4))] if frame_by_frame == "sliced" else [
            helper.make_node("Shape", ["pixels"], ["clip_shape"]),
            *(n for s in ("height", "width") for n in (
                helper.make_node("Gather", ["clip_shape", f"at_{s}"], [f"{s}_scalar"]),
                helper.make_node("Unsqueeze", [f"{s}_scalar", "axis0"], [f"{s}_slice"])))]
        nodes[:0] = [*sides, helper.make_node(
            "Concat", ["frames_and_channels", "height_slice", "width_slice"], ["frame_shape"],
            axis=0), helper.make_node("Reshape", ["pixels", "frame_shape"], ["channels_second"])]
    elif perm:
        nodes.insert(0, helper.make_node("Transpose", ["pixels"], ["channels_second"],
                                         name="to_channels_second", perm=perm))
    else:
        nodes[0].input[0] = "pixels"
    graph = helper.make_graph(
        nodes, "vit", [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def spectrogram_stem(patch: int, stride: int, rows: int, cols: int, extra: int,
                     seed: int = 0) -> onnx.ModelProto:
    """The audio spectrogram transformer's stem on [batch, frames, mel bins], both free:
    the spectrogram given one channel and turned to [N, 1, mel, frames], 8-wide patches of
    `patch` pixels `stride` apart (overlapping), flattened to tokens, `extra` constant
    tokens expanded to the batch and joined in front, and a position embedding for
    `rows` x `cols` patches added: at any other count, the Add fails."""
    rng = np.random.default_rng(seed)
    consts = [numpy_helper.from_array(rng.standard_normal((8, 1, patch, patch)).astype(
                  np.float32), "patch.w"),
              numpy_helper.from_array(rng.standard_normal((1, extra, 8)).astype(np.float32),
                                      "tokens"),
              numpy_helper.from_array(np.array([1], np.int64), "channel"),
              numpy_helper.from_array(np.array([0, 8, -1], np.int64), "flat"),
              numpy_helper.from_array(np.array([0], np.int64), "at_batch"),
              numpy_helper.from_array(np.array([1, 1], np.int64), "one_by_one"),
              numpy_helper.from_array(rng.standard_normal((1, rows * cols + extra, 8)).astype(
                  np.float32), "position")]
    nodes = [helper.make_node("Unsqueeze", ["spectrogram", "channel"], ["one_channel"]),
             helper.make_node("Transpose", ["one_channel"], ["mel_first"], perm=[0, 1, 3, 2]),
             helper.make_node("Conv", ["mel_first", "patch.w"], ["patches"],
                              kernel_shape=[patch, patch], strides=[stride, stride]),
             helper.make_node("Reshape", ["patches", "flat"], ["flat_patches"]),
             helper.make_node("Transpose", ["flat_patches"], ["patch_tokens"], perm=[0, 2, 1]),
             helper.make_node("Shape", ["spectrogram"], ["batch"], start=0, end=1),
             helper.make_node("Concat", ["batch", "one_by_one"], ["token_shape"], axis=0),
             helper.make_node("Expand", ["tokens", "token_shape"], ["batch_tokens"]),
             helper.make_node("Concat", ["batch_tokens", "patch_tokens"], ["all_tokens"], axis=1),
             helper.make_node("Add", ["all_tokens", "position"], ["embedded"]),
             helper.make_node("ReduceMean", ["embedded"], ["pooled"], axes=[1])]
    graph = helper.make_graph(
        nodes, "spectrogram",
        [helper.make_tensor_value_info("spectrogram", TensorProto.FLOAT,
                                       ["batch", "frames", "mel"])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def genai_decoder(heads: int, kv_heads: int, head_size: int, seed: int = 0
                  ) -> onnx.ModelProto:
    """One attention layer as onnxruntime-genai's model builder writes a decoder (Phi-3's,
    Llama's, Qwen's ONNX): a packed query, key and value projection into a
    GroupQueryAttention over key and value caches [batch_size, kv heads,
    past_sequence_length, kv_cache_dim], the head size left free, and an attention mask
    [batch_size, total_sequence_length] that the caches' lengths and the new tokens' sum
    to, read as the lengths the attention takes. Any other head size, or a mask of any
    other length, fails."""
    rng = np.random.default_rng(seed)
    width, vocab = heads * head_size, 32
    consts = [numpy_helper.from_array(rng.standard_normal((vocab, width)).astype(np.float32),
                                      "embed"),
              numpy_helper.from_array(rng.standard_normal(
                  (width, (heads + 2 * kv_heads) * head_size)).astype(np.float32), "qkv"),
              numpy_helper.from_array(np.array([1], np.int64), "axis1"),
              numpy_helper.from_array(np.array(1, np.int32), "one"),
              numpy_helper.from_array(np.array(1, np.int64), "at1")]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["hidden"]),
             helper.make_node("MatMul", ["hidden", "qkv"], ["packed"]),
             helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["seen"], keepdims=0),
             helper.make_node("Cast", ["seen"], ["seen32"], to=TensorProto.INT32),
             helper.make_node("Sub", ["seen32", "one"], ["seqlens_k"]),
             helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
             helper.make_node("Gather", ["mask_shape", "at1"], ["total"]),
             helper.make_node("Cast", ["total"], ["total32"], to=TensorProto.INT32),
             helper.make_node("GroupQueryAttention",
                              ["packed", "", "", "past_key", "past_value", "seqlens_k",
                               "total32"], ["attended", "present_key", "present_value"],
                              domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads)]
    cache = ["batch_size", kv_heads, "past_sequence_length", "kv_cache_dim"]
    graph = helper.make_graph(
        nodes, "decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                       ["batch_size", "sequence_length"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                       ["batch_size", "total_sequence_length"]),
         helper.make_tensor_value_info("past_key", TensorProto.FLOAT, cache),
         helper.make_tensor_value_info("past_value", TensorProto.FLOAT, cache)],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, None)
         for t in ("attended", "present_key", "present_value")], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def masked_cache_step(mask: str = "attention_mask", cache: str = "past_key",
                      width: int = 8) -> onnx.ModelProto:
    """One decoder step as torch's exporter writes a transformers decoder with its cache:
    input_ids [batch, seq], `mask` [batch, mask] (a symbol of its own) and `cache` [batch,
    1, past, width] -> present [batch, 1, past + seq, width], and the mask read at every
    key's position (as transformers builds its causal mask): a mask shorter than past +
    seq fails, in a Gather."""
    rng = np.random.default_rng(0)
    consts = [numpy_helper.from_array(rng.standard_normal((32, width)).astype(np.float32),
                                      "embed"),
              *(numpy_helper.from_array(np.array(v, np.int64), n)
                for n, v in (("at1", 1), ("at2", 2), ("zero", 0), ("one", 1))),
              numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["hidden"]),
             helper.make_node("Unsqueeze", ["hidden", "axis1"], ["k"]),
             helper.make_node("Concat", [cache, "k"], ["present"], axis=2),
             helper.make_node("Shape", ["present"], ["present_shape"]),
             helper.make_node("Gather", ["present_shape", "at2"], ["keys"]),
             helper.make_node("Range", ["zero", "keys", "one"], ["positions"]),
             helper.make_node("Gather", [mask, "positions"], ["seen"], axis=1),
             helper.make_node("Cast", ["seen"], ["seen_float"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["seen_float", "axis1"], ["covered"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "masked_cache_step",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "mask"]),
         helper.make_tensor_value_info(cache, TensorProto.FLOAT, ["batch", 1, "past", width])],
        [helper.make_tensor_value_info("present", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("covered", TensorProto.FLOAT, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def pixel_attention(seed: int = 0) -> onnx.ModelProto:
    """Self-attention over every pixel of an image [n, 3, h, w] (as a diffusion UNet's or
    VAE decoder's over its latents): scores [n, h * w, h * w], 10 GB at 224 a side. The
    pixels are flattened by a Reshape to a shape computed through a Div, as TorchScript
    computes one (`[batch * heads, -1, head size]`), which onnx's shape inference does not
    follow."""
    rng = np.random.default_rng(seed)
    consts = [numpy_helper.from_array(rng.standard_normal((8, 3, 1, 1)).astype(np.float32),
                                      "w"),
              *(numpy_helper.from_array(np.array([v], np.int64), n)
                for n, v in (("at0", 0), ("at2", 2), ("at3", 3), ("eight", 8))),
              numpy_helper.from_array(np.array([1], np.int64), "one")]
    nodes = [helper.make_node("Conv", ["image", "w"], ["features"]),
             helper.make_node("Shape", ["features"], ["shape"]),
             *(helper.make_node("Gather", ["shape", f"at{a}"], [f"d{a}"]) for a in (0, 2, 3)),
             helper.make_node("Mul", ["d2", "d3"], ["pixels"]),
             helper.make_node("Div", ["pixels", "one"], ["tokens"]),
             helper.make_node("Concat", ["d0", "eight", "tokens"], ["flat"], axis=0),
             helper.make_node("Reshape", ["features", "flat"], ["flattened"]),
             helper.make_node("Transpose", ["flattened"], ["tokens_first"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["tokens_first", "flattened"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["weights"]),
             helper.make_node("MatMul", ["weights", "tokens_first"], ["attended"])]
    graph = helper.make_graph(
        nodes, "pixel_attention",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("attended", TensorProto.FLOAT, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def box_reader(dims: Sequence[int | str | None]) -> onnx.ModelProto:
    """Boxes of `dims` ([batch, boxes, corners]: LayoutLM's, whose dynamo export leaves the
    4 corners free) read at constant indices along the last axis, 3 and -4: a box's width.
    Under 4 corners the Gathers fail."""
    indices = [numpy_helper.from_array(np.array(i, np.int64), n) for n, i in (("right", 3),
                                                                            ("left", -4))]
    nodes = [helper.make_node("Gather", ["boxes", "right"], ["x1"], name="x1", axis=2),
             helper.make_node("Gather", ["boxes", "left"], ["x0"], name="x0", axis=-1),
             helper.make_node("Sub", ["x1", "x0"], ["width"], name="width")]
    graph = helper.make_graph(
        nodes, "boxes", [helper.make_tensor_value_info("boxes", TensorProto.INT64, list(dims))],
        [helper.make_tensor_value_info("width", TensorProto.INT64, None)], indices)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def even_rows_model() -> onnx.ModelProto:
    """x [rows, 4] -> y [rows / 2, 8]: a model taking only some sizes (an even number of
    rows), on which made-up inputs (one row) fail."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "pairs"], ["y"], name="pair")], "pairs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])],
        [numpy_helper.from_array(np.array([-1, 8], np.int64), "pairs")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def kv_cache_step(width: int = 8) -> onnx.ModelProto:
    """One decoder step with a key cache, as LLM exports take it: x [batch, seq, width] and
    past [batch, past, width] -> present [batch, past + seq, width] (the cache, extended)
    and y [batch, seq, width] (x attending over it). A first step's cache is empty: past 0."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32),
                                       n) for n in ("wq", "wk")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
             helper.make_node("Concat", ["past", "k"], ["present"], name="extend", axis=1),
             helper.make_node("Transpose", ["present"], ["kt"], name="kt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
             helper.make_node("Softmax", ["scores"], ["attention"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["attention", "present"], ["y"], name="attend")]
    graph = helper.make_graph(
        nodes, "kv_cache",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width]),
         helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", "past", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", width]),
         helper.make_tensor_value_info("present", TensorProto.FLOAT, ["batch", None, width])],
        weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


END_TOKEN = 2


def end_token_model() -> onnx.ModelProto:
    """ids [batch, tokens] -> where the last end token is (as BART's classifier reads its
    hidden state there): a model taking only some values, on which made-up ids (without
    the end token, but now and then) fail. The ids are compared one up, past an Add,
    where made-up values are not drawn to hold it (as they are for BART's comparison:
    `InputSpec.ends_with`). `end_token_ids` makes ids it takes."""
    consts = [numpy_helper.from_array(np.array(END_TOKEN + 1, np.int64), "end"),
              numpy_helper.from_array(np.array(1, np.int64), "one"),
              numpy_helper.from_array(np.array(-1, np.int64), "last")]
    nodes = [helper.make_node("Add", ["ids", "one"], ["up"], name="up"),
             helper.make_node("Equal", ["up", "end"], ["ends"], name="ends"),
             helper.make_node("NonZero", ["ends"], ["where"], name="where"),
             helper.make_node("Gather", ["where", "last"], ["at"], name="at", axis=1)]
    graph = helper.make_graph(
        nodes, "end_token",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("at", TensorProto.INT64, [2])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def end_token_ids(rng: np.random.Generator) -> np.ndarray:
    """Random ids of a random shape, each row ending in the end token."""
    rows, tokens = (int(n) for n in rng.integers(2, 9, 2))
    ids = rng.integers(END_TOKEN + 1, 1000, (rows, tokens), dtype=np.int64)
    ids[:, -1] = END_TOKEN
    return ids


def outer_pairs() -> onnx.ModelProto:
    """Every pair of a clip's samples, summed over one side: activations grow with the
    square of its length, as attention over frames of audio does."""
    f = TensorProto.FLOAT
    return helper.make_model(helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["xt"], name="column"),
         helper.make_node("MatMul", ["xt", "x"], ["pairs"], name="pairs"),
         helper.make_node("ReduceSum", ["pairs", "axes"], ["y"], name="sum", keepdims=0)],
        "outer", [helper.make_tensor_value_info("x", f, [1, "n"])],
        [helper.make_tensor_value_info("y", f, None)],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [0])]),
        opset_imports=[helper.make_opsetid("", 17)])
