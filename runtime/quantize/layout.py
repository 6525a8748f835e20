"""Hand a float region's int8 output to the convolutions after it channels-last.

onnxruntime runs int8 convolutions channels-last (QLinearConv with `channels_last`) and
wraps each in transposes, which cancel between int8 ops. Where a float region (a stem
kept in float, narrow.py) ends in a QuantizeLinear, its int8 tensor is NCHW: it is
transposed before the first convolution, and each residual Add that reads it again
runs NCHW with a transpose on either side, block after block, until a block reads only
convolutions (resnet and cnn: 5 of their 6 transposes).

The rewrite: QuantizeLinear -> Reshape [N, C, H*W] -> Transpose (0, 2, 1) -> Reshape
[N, H, W, C] -> Transpose (0, 3, 1, 2) -> its readers as before. The first three are one
channels-last copy of the int8 tensor, which onnxruntime's transpose optimizer does not
take for a 4-D transpose (it would cancel a 4-D one against the last at once); the last
cancels against the transposes onnxruntime puts before the channels-last convolutions
and pushes through the Adds, so the int8 region runs with none. Bytes move, no
arithmetic: the outputs are bit-identical. A boundary is rewritten only where
onnxruntime's optimized graph (with Prism's session options) then holds fewer
Transposes; where its readers do not run channels-last, the last transpose would stay.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from runtime.devices.ort.options import profiled_run
from runtime.graph import Graph, load_graph
from runtime.inputs import input_specs, random_feeds
from runtime.precision import node_precisions
from runtime.stored import with_weights


def _chw(graph: Graph, tensor: str) -> tuple[int, int, int] | None:
    """Channels, height and width of a 4-D tensor, when all three are static."""
    info = graph.tensors.get(tensor)
    dims = info.dims if info is not None and info.dims is not None else ()
    chw = tuple(d for d in dims[1:] if isinstance(d, int) and d > 0)
    return (chw[0], chw[1], chw[2]) if len(dims) == 4 and len(chw) == 3 else None


def boundaries(graph: Graph) -> list[str]:
    """QuantizeLinear nodes ending a float region: of a float node's 4-D output with
    static channels, height and width."""
    precisions = node_precisions(graph)
    return [n.name for n in graph.nodes if n.op_type == "QuantizeLinear"
            and (src := graph.producer.get(n.inputs[0])) is not None
            and precisions[src] == "float" and _chw(graph, n.inputs[0])]


def hand_off(graph: Graph, quantize: str) -> onnx.ModelProto:
    """The graph's model with QuantizeLinear `quantize` handing its output on channels-last."""
    node = graph.node(quantize)
    chw = _chw(graph, node.inputs[0])
    assert chw is not None, f"{quantize} is not a boundary"
    c, h, w = chw
    out = node.outputs[0]
    taken = {*graph.tensors, *graph.by_name}
    parts = ("nchw", "rows", "cols", "rows_shape", "nhwc_shape", "back")
    base = next(b for i in itertools.count() if not taken & {
        (b := f"{out}_nhwc{i or ''}"), *(f"{b}_{part}" for part in parts)})
    x, rows, cols, shape_rows, shape_nhwc, back = (f"{base}_{part}" for part in parts)
    model = with_weights(graph.model)
    g = model.graph
    at = next(i for i, p in enumerate(g.node) if p.name == quantize)
    g.node[at].output[0] = x
    g.initializer.extend([numpy_helper.from_array(np.array([-1, c, h * w], np.int64), shape_rows),
                          numpy_helper.from_array(np.array([-1, h, w, c], np.int64), shape_nhwc)])
    for i, step in enumerate([
            helper.make_node("Reshape", [x, shape_rows], [rows], name=rows),
            helper.make_node("Transpose", [rows], [cols], name=cols, perm=[0, 2, 1]),
            helper.make_node("Reshape", [cols, shape_nhwc], [base], name=base),
            helper.make_node("Transpose", [base], [out], name=back, perm=[0, 3, 1, 2])]):
        g.node.insert(at + 1 + i, step)
    return model


def transposed_bytes(model: onnx.ModelProto, feeds: Mapping[str, object]) -> int:
    """Bytes the Transpose kernels move in one run of `model` on `feeds` (onnxruntime's
    profiler, Prism's session options): a count of the work, not a timing."""
    return sum(int(e["args"].get("activation_size", 0))
               for e in profiled_run(model.SerializeToString(), feeds)
               if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
               and e["args"].get("op_name") == "Transpose")


def channels_last_handoff(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each float-to-int8 boundary handed off channels-last where that leaves
    onnxruntime fewer bytes to transpose (one profiled run per boundary tried, on random
    inputs; a model that does not run on them is left as it is)."""
    graph = load_graph(model)
    found = boundaries(graph)
    if not found:
        return model
    feeds = random_feeds(input_specs(graph), np.random.default_rng(0))
    with contextlib.suppress(Exception):  # onnxruntime raises plain Exceptions
        fewest = transposed_bytes(graph.model, feeds)
        for quantize in found:
            trial = hand_off(graph, quantize)
            if (moved := transposed_bytes(trial, feeds)) < fewest:
                model, graph, fewest = trial, load_graph(trial), moved
    return model
