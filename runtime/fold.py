"""Constant folding before partitioning: every tensor computed from initializers and
`Constant` nodes alone becomes an initializer, computed once when the model loads.

    report = fold_constants(model)   # in place; report.nodes: the nodes folded away

Exporters leave such nodes in graphs (the legacy PyTorch exporter puts an `Identity` over
many weights; `Constant` nodes hold shapes and scales). Left in, each is "work" for the
partitioner, and a partition reading a weight another makes must make it again as it
loads (`partition.submodel`). onnxruntime folds them when it runs a whole model; Prism
folds them before it cuts the graph.

Values come from onnx's reference evaluator, one node at a time (an `Identity` is a
renamed copy), so a node it cannot evaluate stays a node and nothing else is lost. What
is never folded: `DequantizeLinear` (a quantized weight stays int8 until the fused
kernel reads it, as onnxruntime keeps it), random ops, nodes with subgraphs, ops of
other domains, nodes writing a graph output, and a node whose output size shape
inference cannot bound. Every initializer is a constant: Prism takes no feed for one,
and `load_graph` takes any a graph lists among its inputs out of them first
(`graph.unlist_initializers`).

Memory is bounded: the network's constants after folding never exceed `FOLD_GROWTH`
times what they were (initializers and `Constant` values) plus `FOLD_SLACK`. When the
folded tensors would (an `Expand` or `Tile` of a small constant, a weight read both
directly and through a `Cast`), the folded nodes that grow memory most stay in the graph
as work until the bound holds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from runtime.large import inferable, tensor_bytes
from runtime.onnx_kinds import DEFAULT_DOMAINS
from runtime.stored import Mapped

FOLD_GROWTH = 2.0  # folded constants are at most this many times the constants before...
FOLD_SLACK = 64 << 10  # ... plus this many bytes (shapes and scales of a weightless model)
# Ops whose values differ run to run (Dropout too, when told it trains)
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                        "RandomUniformLike", "Multinomial", "Bernoulli"})
NEVER_FOLDED = RANDOM_OPS | {"DequantizeLinear"}


@dataclass(frozen=True)
class FoldReport:
    """What folding did: the nodes folded into initializers, the constant-only nodes kept
    as work (and why), and the constants' bytes before and after."""

    nodes: tuple[str, ...] = ()
    kept: dict[str, str] = field(default_factory=dict)  # node -> why it stays a node
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def growth(self) -> float:
        """Constant bytes after over before (1.0 when nothing changed)."""
        return self.bytes_after / self.bytes_before if self.bytes_before else 1.0


def _subgraph_reads(node: onnx.NodeProto) -> Iterator[str]:
    """Names a node's subgraphs may read from outer scope (a superset is fine here)."""
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            for inner in g.node:
                yield from inner.input
                yield from _subgraph_reads(inner)
            yield from (o.name for o in g.output)


def _reads(node: onnx.NodeProto) -> Iterator[str]:
    yield from (t for t in node.input if t)
    yield from _subgraph_reads(node)


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute)


def _bounded_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor -> bytes where shape inference (with constants propagated) knows it."""
    try:
        inferred = shape_inference.infer_shapes(inferable(model), check_type=False,
                                                strict_mode=False, data_prop=True)
    except Exception:  # best effort: an unknown size is simply not folded
        return {}
    sizes = {}
    for value in (*inferred.graph.value_info, *inferred.graph.output):
        tt = value.type.tensor_type
        if not value.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        if any(d < 0 for d in dims):
            continue
        try:
            item = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize
        except (KeyError, TypeError, ValueError):
            continue
        sizes[value.name] = math.prod(dims) * item
    return sizes


def _evaluate(node: onnx.NodeProto, values: dict[str, np.ndarray],
              opsets: dict[str, int]) -> list[np.ndarray] | None:
    """The node's outputs from its constant inputs, or None if the evaluator fails."""
    if node.op_type == "Identity" and node.domain in DEFAULT_DOMAINS:
        return [values[node.input[0]]]
    from onnx.reference import ReferenceEvaluator

    try:
        evaluator = ReferenceEvaluator(node, opsets=opsets)
        feeds = {t: values[t] for t in node.input if t}
        return [np.asarray(v) for v in evaluator.run(None, feeds)]
    except Exception:  # whatever the evaluator cannot do stays a node
        return None


def fold_constants(model: onnx.ModelProto) -> FoldReport:
    """Every foldable constant-only node of the model replaced by initializers, in place
    (a loaded model's own copy: the weights are not copied again); what was done."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    outputs = {o.name for o in g.output}
    opsets = {op.domain or "": op.version for op in model.opset_import}
    candidates = [i for i, n in enumerate(g.node) if _candidate(n, outputs)]
    if not candidates:
        return FoldReport()
    sizes = _bounded_sizes(model)
    constant_bytes = sum(tensor_bytes(t) for t in inits.values())
    constant_bytes += sum(tensor_bytes(a.t) for n in g.node if n.op_type == "Constant"
                          for a in n.attribute if a.name == "value")
    budget = FOLD_GROWTH * constant_bytes + FOLD_SLACK
    values: dict[str, np.ndarray] = {}
    mapped = Mapped()  # weights left in their files: read as views of them
    folded: dict[int, None] = {}
    kept: dict[str, str] = {}
    producer: dict[str, int] = {}
    for i in candidates:
        node = g.node[i]
        if not all(t in inits or t in values for t in node.input if t):
            continue
        too_big = [t for t in node.output if t and sizes.get(t, budget + 1) > budget]
        if too_big and node.op_type != "Constant":
            kept[node.name] = f"its output {too_big[0]} has no size within the fold bound"
            continue
        for t in node.input:
            if t and t not in values:
                values[t] = mapped.values(inits[t])
        result = _evaluate(node, values, opsets)
        if result is None or len(result) < len([t for t in node.output if t]):
            kept[node.name] = "onnx's reference evaluator cannot compute it"
            continue
        folded[i] = None
        for t, v in zip(node.output, result, strict=False):
            if t:
                values[t], producer[t] = v, i
    if not folded:
        return FoldReport(kept=kept)
    keep = _within_budget(g, folded, producer, values, inits, budget, kept)
    report = FoldReport(tuple(g.node[i].name for i in folded if i not in keep), kept,
                        constant_bytes,
                        _constant_bytes_after(g, folded, keep, producer, values, inits))
    _rewrite(model, folded, keep, producer, values, mapped)
    return report


def _candidate(node: onnx.NodeProto, outputs: set[str]) -> bool:
    return (node.domain in DEFAULT_DOMAINS and node.op_type not in NEVER_FOLDED
            and not _has_subgraph(node) and not any(t in outputs for t in node.output))


def _live_reads(g: onnx.GraphProto, folded: dict[int, None], keep: set[int]) -> set[str]:
    """Every tensor a node that stays in the graph reads."""
    return {t for i, n in enumerate(g.node) if i not in folded or i in keep for t in _reads(n)}


def _needed(g: onnx.GraphProto, folded: dict[int, None], keep: set[int],
            producer: dict[str, int]) -> list[str]:
    """Folded tensors some node that stays reads (they become initializers)."""
    reads = _live_reads(g, folded, keep)
    return [t for t, i in producer.items() if i not in keep and t in reads]


def _constant_bytes_after(g: onnx.GraphProto, folded: dict[int, None], keep: set[int],
                          producer: dict[str, int], values: dict[str, np.ndarray],
                          inits: dict[str, onnx.TensorProto]) -> int:
    reads = _live_reads(g, folded, keep)  # `keep` holds no Constant node: none is kept
    return (sum(tensor_bytes(t) for name, t in inits.items() if name in reads)
            + sum(values[t].nbytes for t in _needed(g, folded, keep, producer)))


def _within_budget(g: onnx.GraphProto, folded: dict[int, None], producer: dict[str, int],
                   values: dict[str, np.ndarray], inits: dict[str, onnx.TensorProto],
                   budget: float, kept: dict[str, str]) -> set[int]:
    """Folded nodes to keep as work so the constants stay within the budget: the one
    whose output grows most over its inputs first (ties: the earliest). The constants'
    bytes are kept up to date as each node is kept, not recounted over the graph: a
    model whose weights are all made by nodes (onnx's light model-zoo ones) keeps
    hundreds of them."""
    keep: set[int] = set()
    order = {t: k for k, t in enumerate(producer)}
    readers: dict[str, int] = {}  # tensor -> nodes doing work that read it
    total = 0  # bytes of the constants those nodes read
    heap: list[tuple[int, int, int, str]] = []  # (-growth, -size, order, tensor)

    def constant_bytes(t: str) -> int:
        if t in producer:
            return 0 if producer[t] in keep else int(values[t].nbytes)
        return tensor_bytes(inits[t]) if t in inits else 0

    def read(t: str) -> None:
        nonlocal total
        readers[t] = readers.get(t, 0) + 1
        if readers[t] == 1:
            total += constant_bytes(t)
            if t in producer and producer[t] not in keep and \
                    g.node[producer[t]].op_type != "Constant":
                node = g.node[producer[t]]
                inputs = sum(values[i].nbytes for i in node.input if i in values)
                heapq.heappush(heap, (inputs - values[t].nbytes, -values[t].nbytes, order[t], t))

    for i, n in enumerate(g.node):
        if i not in folded:
            for t in _reads(n):
                read(t)
    while total > budget and heap:
        *_, worst = heapq.heappop(heap)
        i = producer[worst]
        if i in keep:
            continue
        keep.add(i)
        total -= sum(int(values[t].nbytes) for t in g.node[i].output if readers.get(t))
        for t in _reads(g.node[i]):
            read(t)
        kept[g.node[i].name] = f"folding {worst} would grow the constants past {FOLD_GROWTH:g}x"
    return keep


def _rewrite(model: onnx.ModelProto, folded: dict[int, None], keep: set[int],
             producer: dict[str, int], values: dict[str, np.ndarray], mapped: Mapped) -> None:
    """The folded nodes out of the model and what stays reads of them in, in place: the
    weights it keeps are never copied (protobuf copies each one put into a graph), nor is
    a folded tensor that is bytes of a weight's file (`Mapped.shell`)."""
    g = model.graph
    reads = _live_reads(g, folded, keep) | {o.name for o in g.output}
    made = [mapped.shell(values[t], t) or numpy_helper.from_array(values[t], t)
            for t in _needed(g, folded, keep, producer)]
    for i in sorted(set(folded) - keep, reverse=True):
        del g.node[i]
    for i in reversed(range(len(g.initializer))):
        if g.initializer[i].name not in reads:
            del g.initializer[i]
    g.initializer.extend(made)
