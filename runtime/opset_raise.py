"""A model raised to a later opset by onnx's version converter, with the one change of
meaning the converter makes put back.

Before opset 11, Upsample and Resize map an output pixel to the input as `x / scale`
(onnxruntime's reading, and the only one its kernels have), and a nearest pixel is the
one below it where the image grows, above it where it shrinks. The converter writes each
as a Resize without saying so, which from opset 11 means half-pixel centres and rounding:
a bilinear segmentation head (torchvision's FCN exported at opset 9) then answers 5.1 off.
So a Resize the converter wrote from an older one is told `asymmetric`, and a nearest one
`floor`, or `ceil` where its constant scales all shrink.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from runtime.graph import default_opset, subgraphs
from runtime.onnx_kinds import DEFAULT_DOMAINS

RESIZE_SCALES = 2  # a Resize's input from opset 11 on: X, roi, scales, sizes
ASYMMETRIC_SINCE = 11  # the first opset whose Resize says how it maps its pixels


def raise_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`model` at ai.onnx `opset` (raises as onnx's version converter does)."""
    converted = version_converter.convert_version(model, opset)
    if (default_opset(model) or 1) < ASYMMETRIC_SINCE <= opset:
        _asymmetric(converted.graph)
    return converted


def _asymmetric(graph: onnx.GraphProto) -> None:
    constants = {t.name: t for t in graph.initializer}
    constants.update((n.output[0], a.t) for n in graph.node if n.op_type == "Constant"
                     for a in n.attribute if a.name == "value")
    for node in graph.node:
        for body in subgraphs(node):
            _asymmetric(body)
        if node.op_type != "Resize" or node.domain not in DEFAULT_DOMAINS:
            continue
        mode = next((helper.get_attribute_value(a) for a in node.attribute
                     if a.name == "mode"), b"nearest")
        scales = constants.get(node.input[RESIZE_SCALES]) if len(node.input) > RESIZE_SCALES \
            else None
        shrinks = scales is not None and bool(np.all(numpy_helper.to_array(scales) <= 1))
        kept = [a for a in node.attribute
                if a.name not in ("coordinate_transformation_mode", "nearest_mode")]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("coordinate_transformation_mode",
                                                            "asymmetric")])
        if mode == b"nearest":
            node.attribute.append(helper.make_attribute("nearest_mode",
                                                        "ceil" if shrinks else "floor"))
