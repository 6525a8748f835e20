"""Resize is linear in X and, for every mode onnxruntime has (nearest, linear, cubic, with
any coordinate transformation and antialias), separable: one interpolation matrix per
resized axis. The node is rewritten as those matrices applied axis by axis (MatMuls, whose
rules give its gradient); each matrix is what the node's own Resize makes of an identity
along that axis, run as the forward is (onnxruntime, else onnx's evaluator), so the
rewrite computes what the node does. Scales and sizes must not depend on the data;
tf_crop_and_resize (its extrapolation value is not linear) and a keep_aspect_ratio_policy
other than stretch are refused.
"""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from runtime.errors import TrainingError
from runtime.train.facts import run_model
from runtime.train.registry import Rewriting, rewrite


@rewrite("Resize")
def resize(r: Rewriting) -> dict[str, str]:
    e, node = r.e, r.node
    x, y = node.input[0], node.output[0]
    if r.attr("coordinate_transformation_mode") == "tf_crop_and_resize" or \
            r.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise TrainingError(f"node {node.name} (Resize): training takes no "
                            f"tf_crop_and_resize and only keep_aspect_ratio_policy stretch")
    before, after = r.shape(x), r.shape(y)
    scales = _scales(r, len(before))
    out = x
    for k, (a, b) in enumerate(zip(before, after, strict=True)):
        if a == b and scales[k] in (None, 1.0):
            continue
        matrix = e.const(_matrix(r, k, a, b, scales[k]), r.facts.dtype(x))  # [a, b]
        last = [*range(k), *range(k + 1, len(before)), k]
        moved = e.op("MatMul", [e.transpose(out, last), matrix])
        out = e.transpose(moved, [*range(k), len(before) - 1, *range(k, len(before) - 1)])
    e.ops("Identity", [out], [y])
    return {}


def _scales(r: Rewriting, rank: int) -> list[float | None]:
    """Each axis's scale where the node gives scales (None where it gives sizes)."""
    node = r.node
    if len(node.input) < 3 or not node.input[2]:  # X, roi, scales, sizes at opset 11 on
        return [None] * rank
    values = [float(v) for v in r.facts.constant(node.input[2], node, "scales").reshape(-1)]
    if not values:
        return [None] * rank
    axes = r.attr("axes") or list(range(rank))
    scales: list[float | None] = [1.0] * rank
    for axis, value in zip(axes, values, strict=True):
        scales[axis % rank] = value
    return scales


def _matrix(r: Rewriting, k: int, a: int, b: int, scale: float | None) -> np.ndarray:
    """The [a, b] matrix of the node's Resize along axis `k` from size a to b: its
    Resize of an identity (basis vectors along another axis, resized along k alone)."""
    rank, dtype = len(r.shape(r.node.input[0])), r.facts.dtype(r.node.input[0])
    holds = 1 if k == 0 else 0  # the axis the basis vectors lie along
    shape = [1] * rank
    shape[holds], shape[k] = a, a
    basis = np.eye(a, dtype=dtype).reshape(shape)  # symmetric: either axis holds them
    attrs = {a_.name: helper.get_attribute_value(a_) for a_ in r.node.attribute
             if a_.name not in ("axes", "keep_aspect_ratio_policy")}
    if scale is not None:
        rates = np.ones(rank, np.float32)
        rates[k] = scale
        feeds = {"x": basis, "roi": np.zeros(0, np.float32), "scales": rates}
        inputs = ["x", "roi", "scales"]
    else:
        sizes = np.asarray(shape, np.int64)
        sizes[k] = b
        feeds = {"x": basis, "roi": np.zeros(0, np.float32), "sizes": sizes}
        inputs = ["x", "roi", "", "sizes"]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Resize", inputs, ["y"], **attrs)], "resize_matrix",
        [], [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(dtype), None)],
        [numpy_helper.from_array(v, n) for n, v in feeds.items()]),
        opset_imports=[helper.make_opsetid("", r.e.opset)])
    # [a, ..., b along k, ...]: row i is basis vector i
    made = np.asarray(run_model(model, {})["y"])
    return np.moveaxis(made, (holds, k), (0, 1)).reshape(a, b)
