"""Per-node FLOPs and bytes, and a device's roofline time for them.

FLOPs follow the usual counts (a multiply-add is 2). Ops without a rule, including the
subgraph nodes If, Loop and Scan, cost one FLOP per output element. Bytes read include
weights (initializers); Constant outputs count as activations, never twice. Work in an
int8 node (`runtime.precision`) runs at the device's `int8_ops`, and a QDQ node reads
its dequantized inputs at their quantized size, as the fused kernel does. A node
computed from weights alone (`Graph.constant_nodes`) takes no time a run: a device
compiling its program folds it as it loads (onnxruntime does, and so would a `sim`
accelerator's compiler); only the `reference` evaluator runs every node every time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from runtime.devices.config import DeviceConfig
from runtime.graph import Graph, Node
from runtime.precision import node_precisions, stored_bytes


@dataclass(frozen=True)
class NodeCost:
    flops: float
    bytes_read: int
    bytes_written: int
    weight_bytes: int
    precision: str | None = None  # `float`, `int8`, or None (moves integers)
    folded: bool = False  # computed from weights alone: made once, as its program loads
    streamed: int | None = None  # the bytes its time is charged for (None: all it moves)

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written


def _numel(shape: tuple[int, ...] | None) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape is not None else 0


Shapes = list[tuple[int, ...] | None]
FlopRule = Callable[[Node, Shapes, Shapes], float]
FLOP_RULES: dict[str, FlopRule] = {}

# Ops whose time is not their bytes' (what they read still counts where memory is
# counted): views, whose output onnxruntime aliases to their input (a Reshape of 64 MB
# took no time where a Neg of it took 3.4 ms), and reads of a shape alone, which write
# only it (a Shape of a batch of 1,000 images was costed 24 ms, as a copy of them, and
# measuring, which cuts a network by roofline time, cut the Swin it was in into 5 chunks
# of 24)
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
SHAPE_OPS = frozenset({"Shape", "Size"})


def rule(*ops: str) -> Callable[[FlopRule], FlopRule]:
    def register(fn: FlopRule) -> FlopRule:
        for op in ops:
            FLOP_RULES[op] = fn
        return fn
    return register


@rule("MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul")
def _matmul(node: Node, ins: Shapes, outs: Shapes) -> float:
    a = ins[0] or (1,)
    return 2.0 * _numel(outs[0]) * (a[-1] if a else 1)


@rule("Gemm")
def _gemm(node: Node, ins: Shapes, outs: Shapes) -> float:
    a = ins[0] or (1, 1)
    k = a[0] if node.attributes.get("transA", 0) else a[-1]
    return 2.0 * _numel(outs[0]) * k + (_numel(outs[0]) if len(ins) > 2 else 0)


def _kernel_volume(node: Node, w: tuple[int, ...] | None) -> int:
    kernel = node.attributes.get("kernel_shape") or (w[2:] if w else ())
    return int(np.prod(kernel)) if len(kernel) else 1


@rule("Conv", "ConvInteger", "QLinearConv")
def _conv(node: Node, ins: Shapes, outs: Shapes) -> float:
    w = ins[3] if node.op_type == "QLinearConv" and len(ins) > 3 else (ins[1] if len(ins) > 1
                                                                      else None)
    cin_per_group = w[1] if w and len(w) > 1 else 1
    bias = _numel(outs[0]) if len(ins) > 2 and node.op_type == "Conv" else 0
    return 2.0 * _numel(outs[0]) * cin_per_group * _kernel_volume(node, w) + bias


@rule("ConvTranspose")
def _conv_transpose(node: Node, ins: Shapes, outs: Shapes) -> float:
    w = ins[1] if len(ins) > 1 else None
    cout_per_group = w[1] if w and len(w) > 1 else 1
    return 2.0 * _numel(ins[0]) * cout_per_group * _kernel_volume(node, w)


@rule("MaxPool", "AveragePool", "LpPool", "MaxRoiPool")
def _pool(node: Node, ins: Shapes, outs: Shapes) -> float:
    return float(_numel(outs[0]) * _kernel_volume(node, None))


@rule("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "ReduceSum", "ReduceMean",
      "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
      "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin", "CumSum")
def _reduce(node: Node, ins: Shapes, outs: Shapes) -> float:
    return float(_numel(ins[0]))


@rule("BatchNormalization", "InstanceNormalization", "LayerNormalization",
      "GroupNormalization", "LpNormalization", "MeanVarianceNormalization",
      "SkipLayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "LRN")
def _norm(node: Node, ins: Shapes, outs: Shapes) -> float:
    per_element = 2 if node.op_type == "BatchNormalization" else 8
    return float(per_element * _numel(ins[0]))


@rule("Softmax", "LogSoftmax", "Hardmax")
def _softmax(node: Node, ins: Shapes, outs: Shapes) -> float:
    return 5.0 * _numel(ins[0])


_TRANSCENDENTAL = ("Exp", "Log", "Tanh", "Sigmoid", "Erf", "Gelu", "Sin", "Cos", "Pow", "Sqrt",
                   "Reciprocal", "Softplus", "Softsign", "Elu", "Selu", "Celu", "Mish",
                   "HardSigmoid", "HardSwish", "FastGelu", "BiasGelu", "QuickGelu")


@rule(*_TRANSCENDENTAL)
def _transcendental(node: Node, ins: Shapes, outs: Shapes) -> float:
    return 4.0 * _numel(outs[0])


@rule(*VIEW_OPS, *SHAPE_OPS)
def _no_arithmetic(node: Node, ins: Shapes, outs: Shapes) -> float:
    return 0.0


def _fallback(node: Node, ins: Shapes, outs: Shapes) -> float:
    """Elementwise ops and anything unknown: one FLOP per output element."""
    return float(sum(_numel(s) for s in outs))


def node_cost(graph: Graph, node: Node) -> NodeCost:
    tensors = graph.tensors
    ins = [tensors[t].shape if t in tensors else None for t in node.inputs]
    outs = [tensors[t].shape if t in tensors else None for t in node.outputs]
    flops = FLOP_RULES.get(node.op_type, _fallback)(node, ins, outs)
    weights = sum(graph.tensor_bytes(t) for t in node.reads if graph.is_weight(t))
    precision = node_precisions(graph)[node.name]
    size = (lambda t: stored_bytes(graph, t)) if precision == "int8" else graph.tensor_bytes
    read = sum(size(t) for t in node.reads)
    written = sum(graph.tensor_bytes(t) for t in node.writes)
    streamed = 0 if node.op_type in VIEW_OPS else written if node.op_type in SHAPE_OPS else None
    return NodeCost(flops, read, written, weights, precision,
                    node.name in graph.constant_nodes, streamed)


def graph_costs(graph: Graph) -> dict[str, NodeCost]:
    return {n.name: node_cost(graph, n) for n in graph.nodes}


def device_seconds(cost: NodeCost, device: DeviceConfig) -> float:
    """Roofline: the slower of compute (at the node's precision) and memory traffic, plus a
    fixed launch cost; nothing for a node the device's program folds."""
    if cost.folded and device.backend not in EVERY_NODE_EVERY_RUN:
        return 0.0
    peak = device.int8_ops if cost.precision == "int8" else device.peak_flops
    moved = cost.bytes_moved if cost.streamed is None else cost.streamed
    return max(cost.flops / peak, moved / device.mem_bandwidth) + device.launch_seconds


# Backends that run every node on every run, folding nothing (onnx's reference evaluator).
EVERY_NODE_EVERY_RUN = frozenset({"reference"})
# Backends whose tensors live in host memory: a copy out of them has nothing to send.
HOST_MEMORY_BACKENDS = frozenset({"cpu", "reference"})


def link_seconds(nbytes: int, device: DeviceConfig) -> float:
    """`nbytes` over the device's link: a fixed latency plus bytes over bandwidth."""
    return device.link_latency + nbytes / device.link_bandwidth


def sends_over_link(device: DeviceConfig) -> bool:
    """Does a copy out of the device use its link (False: its tensors are in host memory)?"""
    return device.backend not in HOST_MEMORY_BACKENDS


def send_seconds(nbytes: int, device: DeviceConfig) -> float:
    """The sending end of a copy: the device's link, or nothing if it works in host memory."""
    return link_seconds(nbytes, device) if sends_over_link(device) else 0.0


def transfer_seconds(nbytes: int, src: DeviceConfig, dst: DeviceConfig) -> float:
    """A copy of `nbytes` from `src` to `dst`, timed from both devices' links.

    Copies are staged through host memory. The sending end writes the tensor out once,
    however many devices read it: `link_seconds` on the sender's link for a device with
    memory of its own (`sim`), nothing for one that works in host memory (`cpu`,
    `reference`: the tensor is there already). The receiving end reads it in over the
    receiver's link, once per receiving device. The two ends stream together, so the copy
    takes as long as its slower end; that is a Transfer's `est_seconds`. What a device is
    charged per request (its stage) is its own end only: `link_seconds` for every tensor
    it receives, `send_seconds` for every tensor it sends. A stage's cost then depends
    on nothing but its own nodes and device, which keeps the balanced split exact, and a
    slow link slows the stages on both sides of it.
    """
    return max(send_seconds(nbytes, src), link_seconds(nbytes, dst))
