"""Types onnx's shape inference leaves out: onnxruntime's quantized contrib ops.

QOperator models use com.microsoft ops (QLinearAdd, QLinearGlobalAveragePool, QGemm,
...) that onnx does not know, so their outputs, and everything after them, come out of
inference untyped, and a partition could not declare them as inputs. The output of a
`QLinear*` or `QGemm` op takes the type of its output zero point (its last input; QGemm
without one is float); its shape is the first input's, broadcast with a second data
input's, pooled to 1 for global pooling, (M, N) for QGemm. Inference then runs again
with these, so the ops after them get types too.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import onnx
from onnx import TensorProto, helper

CONTRIB = "com.microsoft"


def _shape(value: onnx.ValueInfoProto | None) -> list[int | str] | None:
    if value is None or not value.type.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in value.type.tensor_type.shape.dim]


def _out_shape(node: onnx.NodeProto, known: dict) -> list | None:
    first = _shape(known.get(node.input[0]))
    if first is None:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "QLinearGlobalAveragePool":
        return first[:2] + [1] * (len(first) - 2) if not attrs.get("channels_last") else (
            [first[0]] + [1] * (len(first) - 2) + [first[-1]])
    if node.op_type == "QGemm":
        b = _shape(known.get(node.input[3]))
        if b is None or len(first) != 2 or len(b) != 2:
            return None
        return [first[1] if attrs.get("transA") else first[0],
                b[0] if attrs.get("transB") else b[1]]
    if node.op_type in ("QLinearAdd", "QLinearMul") and len(node.input) > 3:
        other = _shape(known.get(node.input[3]))
        if other is not None and all(isinstance(d, int) for d in first + other):
            ints = cast(list[int], first), cast(list[int], other)
            return list(np.broadcast_shapes(tuple(ints[0]), tuple(ints[1])))
    return first


def contrib_value_infos(model: onnx.ModelProto, known: dict[str, onnx.ValueInfoProto]
                        ) -> list[onnx.ValueInfoProto]:
    """Value infos for the untyped outputs of quantized contrib ops, in model order."""
    made = []
    inits = {t.name: t.data_type for t in model.graph.initializer}
    for node in model.graph.node:
        if node.domain != CONTRIB or not (node.op_type.startswith("QLinear")
                                          or node.op_type == "QGemm"):
            continue
        out = node.output[0]
        if out in known and known[out].type.tensor_type.elem_type:
            continue
        zero_point = node.input[-1] if node.op_type != "QGemm" or len(node.input) > 8 else ""
        if zero_point:
            src = known.get(zero_point)
            elem = inits.get(zero_point) or (src.type.tensor_type.elem_type if src else 0)
        else:
            elem = TensorProto.FLOAT
        if not elem:
            continue
        value = helper.make_tensor_value_info(out, elem, _out_shape(node, known))
        known[out] = value
        made.append(value)
    return made
