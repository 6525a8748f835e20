"""Convolutions that onnxruntime runs slower in int8 than in float: kept in float.

onnxruntime's int8 convolution (MLAS, AVX-512 VNNI here) multiplies 4 input channels per
instruction and its fast kernel wants them in multiples of 4 (64 per step); with the 1-4
input channels of an image stem most of that work is padding, while the float NCHWc
kernel vectorises over output channels instead. Measured one Conv -> Relu at a time (one
thread, batch 1, onnxruntime's profiler; float / int8 time):

    input channels   1     3     4     8     16    32     (3x3, 16 out, 32x32)
    float / int8     0.19  0.40  0.82  1.3   1.6   2.3
    input channels   3     4     8     16           (7x7 stride 2, 16 out, 64x64)
    float / int8     0.76  0.95  1.7   3.0

So a group-1 Conv reading fewer than 8 channels stays in float, and so does the
Relu / Clip / MaxPool chain right after it (each the only reader of the one before):
quantizing the MaxPool of a float stem makes onnxruntime run it on uint8 in NCHW, a
generic kernel 30x slower than the float one.
"""

from __future__ import annotations

from runtime.graph import Graph, Node

MIN_CHANNELS = 8  # the least input channels where int8 beat float above
FOLLOWERS = frozenset({"Relu", "Clip", "MaxPool"})


def _narrow(graph: Graph, node: Node) -> bool:
    if node.op_type != "Conv" or node.attributes.get("group", 1) != 1 or len(node.inputs) < 2:
        return False
    weight = graph.tensors.get(node.inputs[1])
    shape = weight.shape if weight is not None and graph.is_weight(weight.name) else None
    return shape is not None and len(shape) > 2 and shape[1] < MIN_CHANNELS


def slow_in_int8(graph: Graph) -> list[str]:
    """Names of the narrow convolutions and the chains after them, in graph order."""
    keep: list[str] = []
    for node in graph.nodes:
        if not _narrow(graph, node):
            continue
        keep.append(node.name)
        while len(readers := graph.consumers.get(node.outputs[0], [])) == 1 and \
                graph.node(readers[0]).op_type in FOLLOWERS:
            node = graph.node(readers[0])
            keep.append(node.name)
    return keep
