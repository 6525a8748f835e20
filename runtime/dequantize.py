"""One reader for each DequantizeLinear, as onnxruntime makes it before fusing QDQ groups.

    one_reader_each(model.graph)   # in place, at load: DQ -> X, DQ -> Y becomes
                                   # DQ -> X, DQ' -> Y (DQ' a copy of DQ)

onnxruntime fuses DequantizeLinear -> op -> QuantizeLinear into an integer kernel only
where the op is the dequantize node's one reader, so it first gives every other reader a
copy of its own (`EnsureUniqueDQForNodeUnit`). Prism cuts the graph before any session
sees it: a dequantize node with readers on both sides of a cut sent its float output
across, four times the bytes of the int8 input, and the reader on the far side ran in
float where onnxruntime, given the model whole, runs it fused (torchvision's MaxViT,
quantized by `prism quantize`, answered 0.019 off onnxruntime's logits over `cpu:2`). With
a copy per reader each copy goes where its reader is (`partition.pairs`) and the cut
passes the int8 tensor. A reader inside a subgraph (If, Loop) keeps the original.
"""

from __future__ import annotations

import onnx

from runtime.names import fresh_name

DEQUANTIZE_OPS = frozenset({"DequantizeLinear"})


def one_reader_each(graph: onnx.GraphProto) -> int:
    """Give each further input a dequantize node feeds a copy of the node, in place (the
    copy right after it); how many copies were made."""
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name:  # an optional input left out reads nothing
                readers.setdefault(name, []).append((node, k))
    taken = {n.name for n in graph.node} | {t for n in graph.node for t in n.output}
    taken |= {v.name for v in (*graph.input, *graph.initializer)}
    nodes: list[onnx.NodeProto] = []
    made = 0
    for node in graph.node:
        nodes.append(node)
        if node.op_type not in DEQUANTIZE_OPS or not node.output:
            continue
        for reader, k in readers.get(node.output[0], [])[1:]:
            twin = onnx.NodeProto()
            twin.CopyFrom(node)
            twin.name, twin.output[0] = (fresh_name(f"{s}/for_{reader.name}", taken)
                                         for s in (node.name, node.output[0]))
            reader.input[k] = twin.output[0]
            nodes.append(twin)
            made += 1
    if made:
        del graph.node[:]
        graph.node.extend(nodes)
    return made

