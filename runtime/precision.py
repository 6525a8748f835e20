"""Which number format each node computes in: `float`, `int8`, or none (moves integers).

Read from the tensors' types, so QOperator models (QLinearConv, MatMulInteger,
QLinearAdd, ...) and QDQ models (float ops between DequantizeLinear and QuantizeLinear)
are both recognised whatever ops a runtime release adds:

- the quantize and dequantize nodes themselves are `int8`;
- a node reading or writing an 8-bit integer tensor is `int8` (QOperator ops, pooling
  or reshaping int8 data);
- a float node whose every float activation is dequantized (or made inside such a group;
  a float bias does not count, a float kernel or matrix keeps it float), and
  which reads a dequantized weight or whose outputs are read only by QuantizeLinear or
  the group, is `int8`: onnxruntime fuses the group into integer kernels (QDQ; this
  covers Conv -> Relu -> QuantizeLinear as PyTorch exports it);
- any other node reading or writing a float tensor is `float`;
- a node whose tensors have no known type (after a custom-domain op shape inference
  does not know) takes its producers' precision when they agree;
- the rest (shapes, indices, booleans) is None: it runs wherever its neighbours do.

A partition boundary should pass int8 tensors: between a QuantizeLinear and a
DequantizeLinear, never between a DequantizeLinear and the op it feeds nor between an
op and the QuantizeLinear after it (the copy would carry float, four times the bytes,
and the op could no longer be fused). `split_pairs` finds boundaries that do.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from runtime.dequantize import DEQUANTIZE_OPS
from runtime.devices.config import PRECISIONS
from runtime.graph import Graph, Node

__all__ = ["PRECISIONS", "assume_precisions", "held_bytes", "node_precisions", "split_pairs",
           "stored_bytes"]
QUANTIZE_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})
INT8_DTYPES = frozenset({"int8", "uint8"})
FLOAT_DTYPES = frozenset({"float16", "float32", "float64", "bfloat16"})
_MEMO = "precisions"
_FUSED = "fused away"  # DequantizeLinear outputs no memory holds (`held_bytes`)


def _dtype(graph: Graph, tensor: str) -> str | None:
    info = graph.tensors.get(tensor)
    return info.dtype if info else None


def _own_precision(graph: Graph, node: Node, known: Mapping[str, str | None]) -> str | None:
    """The precision a node's own tensor types say (QDQ groups are found afterwards)."""
    if node.op_type in QUANTIZE_OPS | DEQUANTIZE_OPS:
        return "int8"
    if not node.reads:  # Constant and friends: data, wherever it is needed
        return None
    dtypes = {_dtype(graph, t) for t in (*node.reads, *node.writes)}
    if dtypes == {None}:
        made = {known.get(graph.producer.get(t, "")) for t in node.reads} - {None}
        return made.pop() if len(made) == 1 else None
    if dtypes & INT8_DTYPES:
        return "int8"
    return "float" if dtypes & FLOAT_DTYPES else None


def _made_by(graph: Graph, tensor: str) -> Node | None:
    return graph.by_name.get(graph.producer.get(tensor, ""))


def _dequantized_weight(graph: Graph, node: Node) -> bool:
    """A DequantizeLinear of a weight: of an initializer, or of a QuantizeLinear of one."""
    src = _made_by(graph, node.inputs[0])
    return graph.is_weight(node.inputs[0]) or (
        src is not None and src.op_type in QUANTIZE_OPS and graph.is_weight(src.inputs[0]))


def _qdq_groups(graph: Graph, known: dict[str, str | None]) -> None:
    """Mark `int8` the float nodes inside QDQ groups: every float activation dequantized
    (or made inside the group), and either a dequantized weight read or every float output
    read only by QuantizeLinear or the group."""
    inside: set[str] = set()
    for node in graph.nodes:
        if known[node.name] != "float":
            continue
        floats = [t for t in node.reads if _dtype(graph, t) in FLOAT_DTYPES]
        if any(graph.is_weight(t) and len(graph.tensors[t].shape or ()) > 1 for t in floats):
            continue  # a float kernel or matrix: the op was left in float
        made = [m for t in floats if not graph.is_weight(t)
                and ((m := _made_by(graph, t)) is None or m.reads)]
        if made and all(m is not None and (m.op_type in DEQUANTIZE_OPS or m.name in inside)
                        for m in made):
            inside.add(node.name)
    for node in reversed(graph.nodes):
        if node.name not in inside:
            continue
        weight = any(_dequantized_weight(graph, m) for t in node.reads
                     if (m := _made_by(graph, t)) is not None and m.op_type in DEQUANTIZE_OPS)
        readers = [c for t in node.writes for c in graph.consumers.get(t, ())]
        closed = readers and not set(node.writes) & graph.output_set and all(
            graph.node(c).op_type in QUANTIZE_OPS or known[c] == "int8" for c in readers)
        if weight or closed:
            known[node.name] = "int8"
        else:
            inside.discard(node.name)


def node_precisions(graph: Graph) -> dict[str, str | None]:
    """Node name -> `float`, `int8` or None; computed once per graph."""
    if _MEMO not in graph.memo:
        known: dict[str, str | None] = {}
        for node in graph.nodes:  # in model order, so producers come first
            known[node.name] = _own_precision(graph, node, known)
        _qdq_groups(graph, known)
        graph.memo[_MEMO] = known
    return graph.memo[_MEMO]


def assume_precisions(graph: Graph, precisions: Mapping[str, str | None]) -> Graph:
    """A view of `graph` whose nodes are taken to compute in `precisions` (others as found):
    used to plan a float model as it would run once quantized."""
    view = copy.copy(graph)
    view.memo = {k: v for k, v in graph.memo.items() if k not in (_MEMO, _FUSED)}
    view.memo[_MEMO] = {**node_precisions(graph), **precisions}
    return view


def stored_bytes(graph: Graph, tensor: str) -> int:
    """Bytes a tensor really occupies: a DequantizeLinear's output is read by the fused
    integer kernel in its quantized form, so it counts at its input's size."""
    made_by = graph.by_name.get(graph.producer.get(tensor, ""))
    if made_by is not None and made_by.op_type in DEQUANTIZE_OPS:
        return graph.tensor_bytes(made_by.inputs[0])
    return graph.tensor_bytes(tensor)


def held_bytes(graph: Graph, tensor: str) -> int:
    """Bytes a tensor holds while its partition runs: none for a DequantizeLinear's output
    every reader of which computes in int8, since the fused kernel reads the int8 tensor
    it dequantizes (a weight, or an activation that counts as itself); a 2.7 GB model
    quantized to 672 MB was planned as 2.7 GB of activations (onnxruntime held 683 MB)."""
    if _FUSED not in graph.memo:
        precisions = node_precisions(graph)
        graph.memo[_FUSED] = frozenset(
            t for n in graph.nodes if n.op_type in DEQUANTIZE_OPS for t in n.writes
            if t not in graph.output_set and graph.consumers.get(t)
            and all(precisions[c] == "int8" for c in graph.consumers[t]))
    return 0 if tensor in graph.memo[_FUSED] else graph.tensor_bytes(tensor)


def split_pairs(graph: Graph, home: Mapping[str, str]) -> list[tuple[str, str]]:
    """(node, node) pairs a boundary separates that should stay together: a
    DequantizeLinear and an op it feeds, an op and the QuantizeLinear it feeds.
    `home` maps node -> partition."""
    out = []
    for node in graph.nodes:
        if node.op_type in DEQUANTIZE_OPS:
            out += [(node.name, c) for t in node.writes for c in graph.consumers.get(t, ())
                    if home[c] != home[node.name]]
        elif node.op_type in QUANTIZE_OPS:
            src = graph.producer.get(node.inputs[0])
            if src is not None and home[src] != home[node.name]:
                out.append((src, node.name))
    return out

