"""Every gradient rule against central differences in float64 (PyTorch gradcheck's
tolerances: eps 1e-6, atol 1e-5, rtol 1e-3; see tests/support/gradcheck.py), on shapes
drawn at random for each run, broadcasting included.

Each case is one node whose float operands are initializers, so `gradients` has to give
every operand's gradient; the loss on top is mse against a random target (the rule for
SoftmaxCrossEntropyLoss is checked as a node too). Every registered rule must have a case
here: a rule added without one fails `test_every_rule_is_checked`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime.train import gradients
from runtime.train.registry import rules
from tests.support.gradcheck import mismatches, numeric_gradients, typed_model

Rng = np.random.Generator


@dataclass(frozen=True)
class Check:
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    target: np.ndarray


def node_check(rng: Rng, op: str, weights: dict[str, np.ndarray], attrs: dict | None = None,
               inputs: dict[str, np.ndarray] | None = None, outputs: int = 1,
               opset: int = 17, order: list[str] | None = None) -> Check:
    names = order or [*weights, *(inputs or {})]
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, outs, name=op.lower(), **(attrs or {}))
    model = typed_model([node], weights, outs[:1], inputs, opset)
    return checked(rng, model, dict(inputs or {}))


def checked(rng: Rng, model: onnx.ModelProto, feeds: dict[str, np.ndarray] | None = None
            ) -> Check:
    """`model` with a random target shaped as its output."""
    shape = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    return Check(model, feeds or {}, rng.standard_normal(shape))


def normal(rng: Rng, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


def away_from_zero(rng: Rng, *shape: int) -> np.ndarray:
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def positive(rng: Rng, *shape: int) -> np.ndarray:
    return rng.uniform(0.5, 2.0, shape)


def shape_of(rng: Rng, rank: int | None = None, low: int = 1, high: int = 4
             ) -> tuple[int, ...]:
    rank = int(rng.integers(1, 4)) if rank is None else rank
    return tuple(int(d) for d in rng.integers(low, high + 1, rank))


def broadcast_partner(rng: Rng, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape numpy broadcasts against `shape` to `shape`: some dims 1, some leading
    ones dropped."""
    dropped = int(rng.integers(0, len(shape) + 1))
    return tuple(1 if rng.random() < 0.4 else d for d in shape[dropped:])


def binary(op: str, operand: Callable[..., np.ndarray] = normal) -> Callable[[Rng], Check]:
    def make(rng: Rng) -> Check:
        a = shape_of(rng)
        b = broadcast_partner(rng, a)
        if rng.random() < 0.5:
            a, b = b, a
        return node_check(rng, op, {"a": normal(rng, *a), "b": operand(rng, *b)})
    return make


def unary(op: str, operand: Callable[..., np.ndarray] = normal, **attrs) -> Callable[[Rng], Check]:
    def make(rng: Rng) -> Check:
        return node_check(rng, op, {"x": operand(rng, *shape_of(rng))}, attrs)
    return make


def relu_like(op: str, **attrs) -> Callable[[Rng], Check]:
    """Kinks at zero: inputs kept away from it, where central differences are exact."""
    return unary(op, away_from_zero, **attrs)


def sum_case(rng: Rng) -> Check:
    a = shape_of(rng)
    return node_check(rng, "Sum", {"a": normal(rng, *a), "b": normal(rng, *broadcast_partner(
        rng, a)), "c": normal(rng, *broadcast_partner(rng, a))})


def matmul_case(rng: Rng) -> Check:
    m, k, n = (int(d) for d in rng.integers(1, 5, 3))
    batch = shape_of(rng, int(rng.integers(0, 3)))
    kind = rng.integers(0, 4)
    a, b = (*batch, m, k), (*broadcast_partner(rng, batch), k, n)
    if kind == 1:
        a = (k,)
    elif kind == 2:
        b = (k,)
    elif kind == 3:
        a, b = (m, k), (*batch, k, n)
    return node_check(rng, "MatMul", {"a": normal(rng, *a), "b": normal(rng, *b)})


def gemm_case(rng: Rng) -> Check:
    m, k, n = (int(d) for d in rng.integers(1, 5, 3))
    ta, tb = int(rng.integers(0, 2)), int(rng.integers(0, 2))
    c = [(n,), (1, n), (m, 1), (m, n), ()][int(rng.integers(0, 5))]
    return node_check(rng, "Gemm", {"a": normal(rng, *((k, m) if ta else (m, k))),
                                    "b": normal(rng, *((n, k) if tb else (k, n))),
                                    "c": normal(rng, *c)},
                      {"transA": ta, "transB": tb, "alpha": float(rng.uniform(0.5, 2)),
                       "beta": float(rng.uniform(0.5, 2))})


def gelu_case(rng: Rng) -> Check:
    approximate = ["none", "tanh"][int(rng.integers(0, 2))]
    return node_check(rng, "Gelu", {"x": normal(rng, *shape_of(rng))},
                      {"approximate": approximate}, opset=20)


def axis_case(op: str) -> Callable[[Rng], Check]:
    def make(rng: Rng) -> Check:
        shape = shape_of(rng, low=2)
        axis = int(rng.integers(-len(shape), len(shape)))
        return node_check(rng, op, {"x": normal(rng, *shape)}, {"axis": axis})
    return make


def pow_case(rng: Rng) -> Check:
    a = shape_of(rng)
    return node_check(rng, "Pow", {"a": positive(rng, *a),
                                   "b": normal(rng, *broadcast_partner(rng, a))})


def clip_case(rng: Rng) -> Check:
    x = away_from_zero(rng, *shape_of(rng))
    return node_check(rng, "Clip", {"x": x, "lo": np.asarray(-0.75), "hi": np.asarray(1.25)})


def where_case(rng: Rng) -> Check:
    shape = shape_of(rng)
    return node_check(rng, "Where", {"a": normal(rng, *broadcast_partner(rng, shape)),
                                     "b": normal(rng, *shape)},
                      inputs={"cond": rng.random(shape) < 0.5}, order=["cond", "a", "b"])


def cast_case(rng: Rng) -> Check:
    return node_check(rng, "Cast", {"x": normal(rng, *shape_of(rng))},
                      {"to": TensorProto.DOUBLE})


def expand_case(rng: Rng) -> Check:
    shape = shape_of(rng, 3)
    small = broadcast_partner(rng, shape)
    return node_check(rng, "Expand", {"x": normal(rng, *small)},
                      inputs={"shape": np.asarray(shape, np.int64)}, order=["x", "shape"])


def reshape_case(rng: Rng) -> Check:
    shape = shape_of(rng, 3)
    return node_check(rng, "Reshape", {"x": normal(rng, *shape),
                                       "shape": np.asarray([-1, shape[-1]], np.int64)})


def flatten_case(rng: Rng) -> Check:
    shape = shape_of(rng, 3)
    return node_check(rng, "Flatten", {"x": normal(rng, *shape)},
                      {"axis": int(rng.integers(0, 3))})


def squeeze_case(rng: Rng) -> Check:
    shape = (*shape_of(rng, 2), 1)
    return node_check(rng, "Squeeze", {"x": normal(rng, *shape),
                                       "axes": np.asarray([2], np.int64)})


def unsqueeze_case(rng: Rng) -> Check:
    return node_check(rng, "Unsqueeze", {"x": normal(rng, *shape_of(rng, 2)),
                                         "axes": np.asarray([0, 3], np.int64)})


def dropout_case(rng: Rng) -> Check:
    """In training mode too: trained as in inference."""
    return node_check(rng, "Dropout", {"x": normal(rng, *shape_of(rng))},
                      inputs={"ratio": np.asarray(0.5), "mode": np.asarray(True)},
                      order=["x", "ratio", "mode"])


def cast_like_case(rng: Rng) -> Check:
    return node_check(rng, "CastLike", {"x": normal(rng, *shape_of(rng)),
                                        "like": np.zeros(1)})


def transpose_case(rng: Rng) -> Check:
    shape = shape_of(rng, 3, low=2)
    return node_check(rng, "Transpose", {"x": normal(rng, *shape)},
                      {"perm": [int(p) for p in rng.permutation(3)]})


def concat_case(rng: Rng) -> Check:
    shape = shape_of(rng, 3)
    axis = int(rng.integers(0, 3))
    parts = {}
    for name in "abc":
        part = list(shape)
        part[axis] = int(rng.integers(1, 4))
        parts[name] = normal(rng, *part)
    return node_check(rng, "Concat", parts, {"axis": axis - 3 if rng.random() < 0.5 else axis})


def slice_case(rng: Rng) -> Check:
    shape = shape_of(rng, 3, low=3, high=6)
    step = [1, 2, -1][int(rng.integers(0, 3))]
    if step > 0:
        starts, ends = [1, -3], [2**62, -1]
    else:
        starts, ends = [-1, 3], [-(2**62), 0]
    return node_check(rng, "Slice", {"x": normal(rng, *shape),
                                     "starts": np.asarray(starts, np.int64),
                                     "ends": np.asarray(ends, np.int64),
                                     "axes": np.asarray([0, 2], np.int64),
                                     "steps": np.asarray([step, 1 if step > 0 else -1],
                                                         np.int64)})


def gather_case(rng: Rng) -> Check:
    shape = shape_of(rng, int(rng.integers(1, 4)), low=2)
    axis = int(rng.integers(0, len(shape)))
    size = shape[axis]
    indices = rng.integers(-size, size, shape_of(rng, int(rng.integers(0, 3))))
    return node_check(rng, "Gather", {"x": normal(rng, *shape)}, {"axis": axis},
                      inputs={"i": indices.astype(np.int64)}, order=["x", "i"])


def reduce_case(op: str) -> Callable[[Rng], Check]:
    def make(rng: Rng) -> Check:
        shape = shape_of(rng, 3)
        axes = sorted(int(a) for a in rng.choice(3, int(rng.integers(1, 3)), replace=False))
        return node_check(rng, op, {"x": normal(rng, *shape), "axes": np.asarray(axes, np.int64)},
                          {"keepdims": int(rng.integers(0, 2))}, opset=18)
    return make


def conv_case(rng: Rng) -> Check:
    rank = int(rng.integers(1, 3))
    group = int(rng.integers(1, 3))
    cin, cout = group * int(rng.integers(1, 3)), group * int(rng.integers(1, 3))
    kernel = tuple(int(k) for k in rng.integers(1, 4, rank))
    strides = [int(s) for s in rng.integers(1, 3, rank)]
    dilations = [int(d) for d in rng.integers(1, 3, rank)]
    spatial = [int(rng.integers((k - 1) * d + 1, (k - 1) * d + 5))
               for k, d in zip(kernel, dilations, strict=True)]
    attrs: dict = {"group": group, "strides": strides, "dilations": dilations}
    if rng.random() < 0.3:
        attrs["auto_pad"] = "SAME_UPPER" if rng.random() < 0.5 else "SAME_LOWER"
    else:
        attrs["pads"] = [int(p) for p in rng.integers(0, 2, 2 * rank)]
    weights = {"x": normal(rng, 2, cin, *spatial),
               "w": normal(rng, cout, cin // group, *kernel)}
    if rng.random() < 0.7:
        weights["b"] = normal(rng, cout)
    return node_check(rng, "Conv", weights, attrs)


def conv_transpose_case(rng: Rng) -> Check:
    """SAME padding only where the windows reach the output's end: onnx's reference
    evaluator, which runs float64 ConvTranspose, sizes the others as the spec does and
    onnxruntime does not (`tests/train/test_gradients.py` checks them there)."""
    rank = int(rng.integers(1, 3))
    while True:
        kernel, spatial = [int(k) for k in rng.integers(1, 4, rank)], shape_of(rng, rank)
        strides = [int(s) for s in rng.integers(1, 4, rank)]
        dilations = [int(d) for d in rng.integers(1, 3, rank)]
        extra = [int(rng.integers(0, s)) for s in strides]
        reach = [s * (i - 1) + p + (k - 1) * d + 1 for s, i, p, k, d in zip(
            strides, spatial, extra, kernel, dilations, strict=True)]
        attrs: dict = {"strides": strides, "dilations": dilations, "output_padding": extra}
        if rng.random() < 0.3:
            attrs["pads"] = pads = [int(p) for p in rng.integers(0, 2, 2 * rank)]
            fits = all(r > b + e for r, b, e in zip(reach, pads, pads[rank:], strict=False))
        elif rng.random() < 0.5:  # the windows' reach, cut by up to 2 or grown within a
            # stride (onnxruntime refuses more): output padding counts in neither
            attrs["output_shape"] = [max(1, r - p + int(rng.integers(-2, s))) for r, p, s in zip(
                reach, extra, strides, strict=True)]
            fits = True
        else:
            attrs["auto_pad"] = ["SAME_UPPER", "SAME_LOWER", "VALID"][int(rng.integers(0, 3))]
            fits = all(r >= s * i for r, s, i in zip(reach, strides, spatial, strict=True))
        if fits:
            break
    attrs["group"] = group = int(rng.integers(1, 3))
    cin, cout = (group * int(c) for c in rng.integers(1, 3, 2))
    weights = {"x": normal(rng, 2, cin, *spatial), "w": normal(rng, cin, cout // group, *kernel)}
    if rng.random() < 0.7:
        weights["b"] = normal(rng, cout)
    return node_check(rng, "ConvTranspose", weights, attrs)


def pool_case(op: str) -> Callable[[Rng], Check]:
    def make(rng: Rng) -> Check:
        kernel = [int(k) for k in rng.integers(1, 4, 2)]
        attrs: dict = {"kernel_shape": kernel, "strides": [int(s) for s in rng.integers(1, 4, 2)],
                       "pads": [int(rng.integers(0, k)) for k in kernel * 2],
                       "ceil_mode": int(rng.integers(0, 2))}
        if op == "AveragePool":
            attrs["count_include_pad"] = int(rng.integers(0, 2))
        spatial = [int(rng.integers(k, k + 5)) for k in kernel]
        # distinct values: a tie for the max has no derivative
        x = rng.permutation(2 * 2 * spatial[0] * spatial[1]).reshape(2, 2, *spatial) / 7.0
        return node_check(rng, op, {"x": x}, attrs)
    return make


def global_average_pool_case(rng: Rng) -> Check:
    return node_check(rng, "GlobalAveragePool", {"x": normal(rng, 2, 3, *shape_of(rng, 2))})


def batch_norm_case(rng: Rng) -> Check:
    c = int(rng.integers(1, 4))
    shape = (int(rng.integers(2, 4)), c, *shape_of(rng, int(rng.integers(0, 3))))
    return node_check(rng, "BatchNormalization", {
        "x": normal(rng, *shape), "scale": normal(rng, c), "bias": normal(rng, c),
        "mean": normal(rng, c), "var": positive(rng, c)},
        {"epsilon": 1e-3, "training_mode": 1}, outputs=3)  # as exported: running stats too


def instance_norm_case(rng: Rng) -> Check:
    c = int(rng.integers(1, 4))
    shape = (int(rng.integers(1, 4)), c, *shape_of(rng, int(rng.integers(1, 3)), low=2))
    return node_check(rng, "InstanceNormalization", {
        "x": normal(rng, *shape), "scale": normal(rng, c), "bias": normal(rng, c)},
        {"epsilon": 1e-3})


def layer_norm_case(rng: Rng) -> Check:
    shape = shape_of(rng, 3, low=2)
    axis = int(rng.integers(1, 3))
    scale = broadcast_partner(rng, shape[axis:])
    return node_check(rng, "LayerNormalization", {
        "x": normal(rng, *shape), "scale": normal(rng, *scale),
        "bias": normal(rng, *shape[axis:])}, {"axis": axis, "epsilon": 1e-3})


def recurrent(op: str, gates: int, states: int, **attrs: Callable[[Rng], int]
              ) -> Callable[[Rng], Check]:
    """RNN, GRU, LSTM: every direction and layout, with and without biases and initial
    states; the model's output one of Y and the final states (those before it unnamed),
    so each one's gradient is checked."""
    def make(rng: Rng) -> Check:
        steps, batch, size, hidden = (int(v) for v in rng.integers(1, 4, 4))
        direction = ["forward", "reverse", "bidirectional"][int(rng.integers(0, 3))]
        ways, layout = 2 if direction == "bidirectional" else 1, int(rng.integers(0, 2))
        weights = {"x": normal(rng, *((batch, steps, size) if layout else (steps, batch, size))),
                   "w": normal(rng, ways, gates * hidden, size),
                   "r": normal(rng, ways, gates * hidden, hidden)}
        if rng.random() < 0.7:
            weights["b"] = normal(rng, ways, 2 * gates * hidden)
        order = ["x", "w", "r", "b" if "b" in weights else ""]
        if rng.random() < 0.5:
            shape = (batch, ways, hidden) if layout else (ways, batch, hidden)
            initial = [f"s{i}" for i in range(states)]
            weights.update({name: normal(rng, *shape) for name in initial})
            order += ["", *initial]
        while not order[-1]:
            order.pop()
        outputs = [""] * int(rng.integers(0, 1 + states)) + ["y"]
        node = helper.make_node(op, order, outputs, name=op.lower(), hidden_size=hidden,
                                direction=direction, layout=layout,
                                **{k: draw(rng) for k, draw in attrs.items()})
        return checked(rng, typed_model([node], weights, ["y"]))
    return make


def softmax_cross_entropy_case(rng: Rng) -> Check:
    n, c = int(rng.integers(2, 5)), int(rng.integers(2, 5))
    extra = shape_of(rng, int(rng.integers(0, 2)))
    labels = rng.integers(0, c, (n, *extra)).astype(np.int64)
    attrs: dict = {"reduction": ["mean", "sum", "none"][int(rng.integers(0, 3))]}
    if rng.random() < 0.5:
        attrs["ignore_index"] = int(labels.reshape(-1)[0])
    weights = {"scores": normal(rng, n, c, *extra)}
    if rng.random() < 0.6:
        weights["w"] = positive(rng, c)
    order = ["scores", "labels", *(["w"] if "w" in weights else [])]
    return node_check(rng, "SoftmaxCrossEntropyLoss", weights, attrs,
                      inputs={"labels": labels}, order=order)


def pad_case(rng: Rng) -> Check:
    """Constant (a crop of one at each end leaves something), or reflect, edge or wrap
    (reflect's pads within the axis, its edge not repeated)."""
    shape = shape_of(rng, 3, low=3)
    mode = str(rng.choice(["constant", "reflect", "edge", "wrap"]))
    if mode == "constant":
        pads = [int(p) for p in rng.integers(-1, 3, 6)]
        return node_check(rng, "Pad", {"x": normal(rng, *shape), "pads": np.asarray(
            pads, np.int64), "value": np.asarray(0.0)})
    pads = [int(rng.integers(0, d)) for d in shape * 2]
    return node_check(rng, "Pad", {"x": normal(rng, *shape), "pads": np.asarray(pads, np.int64)},
                      {"mode": mode})


def split_case(rng: Rng) -> Check:
    shape = shape_of(rng, 3, low=3, high=5)
    axis = int(rng.integers(0, 3))
    first = int(rng.integers(1, shape[axis]))
    # only the first output is the model's: the second's gradient is zeros
    return node_check(rng, "Split", {"x": normal(rng, *shape),
                                     "split": np.asarray([first, shape[axis] - first],
                                                         np.int64)},
                      {"axis": axis}, outputs=2)


def variadic(op: str) -> Callable[[Rng], Check]:
    def make(rng: Rng) -> Check:
        a = shape_of(rng)
        # distinct values: a tie has no derivative
        operands = {"a": normal(rng, *a), "b": normal(rng, *broadcast_partner(rng, a)),
                    "c": normal(rng, *broadcast_partner(rng, a))}
        return node_check(rng, op, operands)
    return make


def hard_case(op: str) -> Callable[[Rng], Check]:
    """Inputs spread over every piece of the function, none at a kink."""
    def make(rng: Rng) -> Check:
        x = rng.uniform(-5, 5, shape_of(rng))
        x = np.where(np.abs(np.abs(x) - 3) < 0.1, x + 0.3, x)
        x = np.where(np.abs(np.abs(x * 0.2 + 0.5) - 0.5) < 0.05, x + 0.5, x)
        return node_check(rng, op, {"x": x})
    return make


def mish_case(rng: Rng) -> Check:
    return node_check(rng, "Mish", {"x": normal(rng, *shape_of(rng))}, opset=18)


def prelu_case(rng: Rng) -> Check:
    shape = shape_of(rng)
    return node_check(rng, "PRelu", {"x": away_from_zero(rng, *shape),
                                     "slope": normal(rng, *broadcast_partner(rng, shape))})


def tile_case(rng: Rng) -> Check:
    shape = shape_of(rng)
    return node_check(rng, "Tile", {"x": normal(rng, *shape), "repeats": rng.integers(
        1, 4, len(shape)).astype(np.int64)})


def cum_sum_case(rng: Rng) -> Check:
    shape = shape_of(rng)
    return node_check(rng, "CumSum", {"x": normal(rng, *shape), "axis": np.asarray(
        int(rng.integers(-len(shape), len(shape))), np.int64)},
        {"exclusive": int(rng.integers(0, 2)), "reverse": int(rng.integers(0, 2))})


def gather_elements_case(rng: Rng) -> Check:
    shape = shape_of(rng, low=2)
    axis = int(rng.integers(0, len(shape)))
    taken = [int(rng.integers(1, 4)) if i == axis else int(rng.integers(1, d + 1))
             for i, d in enumerate(shape)]
    indices = rng.integers(-shape[axis], shape[axis], taken).astype(np.int64)
    return node_check(rng, "GatherElements", {"x": normal(rng, *shape)}, {"axis": axis},
                      inputs={"i": indices}, order=["x", "i"])


def depth_to_space_case(rng: Rng) -> Check:
    b = int(rng.integers(2, 4))
    n, k, h, w = (int(v) for v in rng.integers(1, 3, 4))
    return node_check(rng, "DepthToSpace", {"x": normal(rng, n, b * b * k, h, w)},
                      {"blocksize": b, "mode": ["DCR", "CRD"][int(rng.integers(0, 2))]})


def space_to_depth_case(rng: Rng) -> Check:
    b = int(rng.integers(2, 4))
    n, c, h, w = (int(v) for v in rng.integers(1, 3, 4))
    return node_check(rng, "SpaceToDepth", {"x": normal(rng, n, c, b * h, b * w)},
                      {"blocksize": b})


def resize_case(rng: Rng) -> Check:
    """Every mode and coordinate transformation, up and down, by scales or sizes (given
    by Constant nodes: as initializers they would count as weights here), antialias."""
    mode = ["nearest", "linear", "cubic"][int(rng.integers(0, 3))]
    spatial = [int(d) for d in rng.integers(2, 5, 2)]
    rates = [float(rng.choice([0.5, 0.75, 1.5, 2.0, 3.0])) for _ in spatial]
    attrs: dict = {"mode": mode, "coordinate_transformation_mode": [
        "half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"][int(rng.integers(
            0, 4))]}
    if mode == "nearest":
        attrs["nearest_mode"] = ["round_prefer_floor", "round_prefer_ceil", "floor",
                                 "ceil"][int(rng.integers(0, 4))]
    elif rng.random() < 0.3:
        attrs["antialias"] = 1
    if rng.random() < 0.5:
        setting, value = "scales", np.asarray([1.0, 1.0, *rates], np.float32)
        inputs = ["x", "roi", "scales"]
    else:
        setting = "sizes"
        value = np.asarray([1, 2, *(max(1, int(d * r)) for d, r in zip(
            spatial, rates, strict=True))], np.int64)
        inputs = ["x", "roi", "", "sizes"]
    nodes = [helper.make_node("Constant", [], ["roi"], value=numpy_helper.from_array(
                 np.zeros(0, np.float32))),
             helper.make_node("Constant", [], [setting], value=numpy_helper.from_array(value)),
             helper.make_node("Resize", inputs, ["y0"], name="resize", **attrs)]
    return checked(rng, typed_model(nodes, {"x": normal(rng, 1, 2, *spatial)}, ["y0"],
                                    opset=18))


def top_k_case(rng: Rng) -> Check:
    """Distinct values (a tie has no derivative); the values are the model's output."""
    shape = shape_of(rng, low=2)
    axis = int(rng.integers(-len(shape), len(shape)))
    x = rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0
    return node_check(rng, "TopK", {"x": x, "k": np.asarray(
        [int(rng.integers(1, shape[axis] + 1))], np.int64)},
        {"axis": axis, "largest": int(rng.integers(0, 2)), "sorted": int(rng.integers(0, 2))},
        outputs=2)


def gather_nd_case(rng: Rng) -> Check:
    """Indices reaching 1 to all of the axes after 0-2 batch axes, repeated ones and
    negative ones among them."""
    batch = shape_of(rng, int(rng.integers(0, 3)), low=2)
    shape = shape_of(rng, int(rng.integers(1, 4)), low=2)
    depth = int(rng.integers(1, len(shape) + 1))
    rows = (*batch, *shape_of(rng, int(rng.integers(0, 3))))
    indices = np.stack([rng.integers(-d, d, rows) for d in shape[:depth]], axis=-1)
    return node_check(rng, "GatherND", {"x": normal(rng, *batch, *shape)},
                      {"batch_dims": len(batch)}, inputs={"i": indices.astype(np.int64)},
                      order=["x", "i"])



def mod_case(rng: Rng) -> Check:
    """a kept between multiples of b, where Mod jumps: floats take fmod 1."""
    a = shape_of(rng)
    b = away_from_zero(rng, *broadcast_partner(rng, a))
    steps = rng.integers(-3, 3, a) + rng.uniform(0.2, 0.8, a)
    return node_check(rng, "Mod", {"a": np.broadcast_to(b, a) * steps, "b": b}, {"fmod": 1})

def inside_unit(rng: Rng, *shape: int) -> np.ndarray:
    return rng.uniform(-0.9, 0.9, shape)


def above_one(rng: Rng, *shape: int) -> np.ndarray:
    return rng.uniform(1.1, 3.0, shape)


def trilu_case(rng: Rng) -> Check:
    shape = shape_of(rng, int(rng.integers(2, 4)), low=2)
    return node_check(rng, "Trilu", {"x": normal(rng, *shape)}, {"upper": int(rng.integers(0, 2))},
                      inputs={"k": np.asarray(int(rng.integers(-2, 3)), np.int64)},
                      order=["x", "k"])


def global_max_pool_case(rng: Rng) -> Check:
    shape = (2, 3, *shape_of(rng, 2))
    x = rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0  # no ties
    return node_check(rng, "GlobalMaxPool", {"x": x})


def scatter_case(op: str) -> Callable[[Rng], Check]:
    """Distinct positions (repeated ones without a reduction are undefined), reduction
    none or add; the updates are weights too."""
    def make(rng: Rng) -> Check:
        shape = shape_of(rng, int(rng.integers(1, 4)), low=2)
        attrs = {"reduction": str(rng.choice(["none", "add"]))}
        if op == "ScatterND":
            depth = int(rng.integers(1, len(shape) + 1))
            cells = np.array(list(np.ndindex(*shape[:depth])))
            picked = cells[rng.choice(len(cells), int(rng.integers(1, len(cells) + 1)),
                                      replace=False)]
            indices, updates = picked, (len(picked), *shape[depth:])
        else:
            attrs["axis"] = int(rng.integers(0, len(shape)))
            taken = [int(rng.integers(1, d + 1)) for d in shape]
            taken[attrs["axis"]] = int(rng.integers(1, shape[attrs["axis"]] + 1))
            indices = np.stack([rng.permutation(shape[attrs["axis"]])[:taken[attrs["axis"]]]
                                for _ in range(int(np.prod(taken)) // taken[attrs["axis"]])],
                               axis=-1)
            indices = np.moveaxis(indices.reshape(taken[attrs["axis"]], *[
                t for i, t in enumerate(taken) if i != attrs["axis"]]), 0, attrs["axis"])
            updates = tuple(taken)
        return node_check(rng, op, {"x": normal(rng, *shape), "u": normal(rng, *updates)},
                          attrs, inputs={"i": indices.astype(np.int64)}, order=["x", "i", "u"],
                          opset=18)
    return make


def reduce_prod_case(rng: Rng) -> Check:
    """Elements away from zero, or with one or two exact zeros, whose gradient is the
    product of the others (kinks elsewhere: central differences step off zero)."""
    check = reduce_case("ReduceProd")(rng)
    x = numpy_helper.to_array(check.model.graph.initializer[0]).copy()
    x = np.where(np.abs(x) < 0.3, 0.3, x)
    for _ in range(int(rng.integers(0, 3))):
        x.flat[int(rng.integers(0, x.size))] = 0.0
    check.model.graph.initializer[0].CopyFrom(numpy_helper.from_array(x, "x"))
    return check


def grid_sample_case(rng: Rng) -> Check:
    """2-D or 3-D, linear or nearest (or 2-D cubic), every padding mode, both corner
    conventions; the grid (a weight too) reaching past the input, its source coordinates
    kept off the kinks: whole and half pixels, where a corner, a rounding or a reflection
    changes."""
    rank = int(rng.integers(2, 4))
    modes = ["linear", "nearest", "cubic"] if rank == 2 else ["linear", "nearest"]
    attrs = {"mode": str(rng.choice(modes)), "align_corners": int(rng.integers(0, 2)),
             "padding_mode": str(rng.choice(["zeros", "border", "reflection"]))}
    n, c = (int(v) for v in rng.integers(1, 4, 2))
    size, out = rng.integers(1, 5, rank), [int(v) for v in rng.integers(1, 4, rank)]
    sizes = size[::-1]  # the grid's last axis runs over the input's axes backwards
    source = rng.uniform(-2, sizes + 1, (n, *out, rank))
    source = np.floor(source * 2) / 2 + rng.uniform(0.1, 0.4, source.shape)  # off the kinks
    if attrs["align_corners"]:
        grid = source / np.maximum(sizes - 1, 1) * 2 - 1
    else:
        grid = (source * 2 + 1) / sizes - 1
    return node_check(rng, "GridSample", {"x": normal(rng, n, c, *size), "grid": grid},
                      attrs, opset=20)


def col2im_case(rng: Rng) -> Check:
    """Blocks of any size, strides, dilations and pads that tile the image exactly."""
    block = [int(b) for b in rng.integers(1, 4, 2)]
    strides, dilations = ([int(v) for v in rng.integers(1, 3, 2)] for _ in range(2))
    pads = [int(p) for p in rng.integers(0, 2, 4)]
    counts = [int(c) for c in rng.integers(1, 4, 2)]  # blocks along each axis
    image = [(c - 1) * s + (b - 1) * d + 1 - lo - hi for c, s, b, d, lo, hi in zip(
        counts, strides, block, dilations, pads[:2], pads[2:], strict=True)]
    if min(image) < 1:
        return col2im_case(rng)
    channels = int(rng.integers(1, 3))
    return node_check(rng, "Col2Im", {"x": normal(rng, 2, channels * block[0] * block[1],
                                                  counts[0] * counts[1]),
                                      "image": np.asarray(image, np.int64),
                                      "block": np.asarray(block, np.int64)},
                      {"strides": strides, "dilations": dilations, "pads": pads}, opset=18)


def lp_normalization_case(rng: Rng) -> Check:
    shape = shape_of(rng, low=2)
    return node_check(rng, "LpNormalization", {"x": away_from_zero(rng, *shape)},
                      {"axis": int(rng.integers(-len(shape), len(shape))),
                       "p": int(rng.integers(1, 3))}, opset=int(rng.choice([17, 18])))


def max_unpool_case(rng: Rng) -> Check:
    """SegNet's decoder: MaxPool's values put back where its indices say (distinct values:
    a tie for the max has no derivative)."""
    n, c, h, w = (int(v) for v in rng.integers(1, 3, 4))
    x = rng.permutation(n * c * 4 * h * 4 * w).reshape(n, c, 4 * h, 4 * w) / 7.0
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], name="pool", **pool),
             helper.make_node("MaxUnpool", ["p", "i"], ["y0"], name="unpool", **pool)]
    return checked(rng, typed_model(nodes, {"x": x}, ["y0"]))


def lrn_case(rng: Rng) -> Check:
    size = int(rng.integers(1, 6))
    return node_check(rng, "LRN", {"x": normal(rng, 2, int(rng.integers(1, 7)), *shape_of(rng, 2))},
                      {"size": size, "alpha": float(rng.uniform(0.1, 1)),
                       "beta": float(rng.uniform(0.5, 1)), "bias": float(rng.uniform(1, 2))})


EQUATIONS = ["ij,jk->ik", "bij,bjk->bik", "ij->ji", "ij->i", "ij,j->i", "i,j->ij",
             "bhqd,bhkd->bhqk", "ij,ij->", "ijk->", "ij,jk", "ij,kj->ik"]


def einsum_case(rng: Rng) -> Check:
    equation = EQUATIONS[int(rng.integers(0, len(EQUATIONS)))]
    sizes = {c: int(rng.integers(1, 4)) for c in "bhqkdij"}
    terms = equation.split("->")[0].split(",")
    operands = {f"x{i}": normal(rng, *(sizes[c] for c in t)) for i, t in enumerate(terms)}
    return node_check(rng, "Einsum", operands, {"equation": equation})


CASES: dict[str, Callable[[Rng], Check]] = {
    "Add": binary("Add"), "Sub": binary("Sub"), "Mul": binary("Mul"),
    "Div": binary("Div", away_from_zero), "Sum": sum_case, "MatMul": matmul_case,
    "Gemm": gemm_case, "Relu": relu_like("Relu"),
    "LeakyRelu": relu_like("LeakyRelu", alpha=0.2), "Sigmoid": unary("Sigmoid"),
    "Tanh": unary("Tanh"), "Erf": unary("Erf"), "Gelu": gelu_case,
    "Softmax": axis_case("Softmax"), "LogSoftmax": axis_case("LogSoftmax"),
    "Neg": unary("Neg"), "Exp": unary("Exp"), "Log": unary("Log", positive),
    "Sqrt": unary("Sqrt", positive), "Reciprocal": unary("Reciprocal", away_from_zero),
    "Pow": pow_case, "Clip": clip_case, "Where": where_case, "Cast": cast_case,
    "Expand": expand_case, "Identity": unary("Identity"), "Reshape": reshape_case,
    "Flatten": flatten_case, "Squeeze": squeeze_case, "Unsqueeze": unsqueeze_case,
    "Dropout": dropout_case, "Transpose": transpose_case, "Concat": concat_case,
    "Slice": slice_case, "Gather": gather_case, "ReduceSum": reduce_case("ReduceSum"),
    "ReduceMean": reduce_case("ReduceMean"), "Conv": conv_case,
    "ConvTranspose": conv_transpose_case,
    "MaxPool": pool_case("MaxPool"), "AveragePool": pool_case("AveragePool"),
    "GlobalAveragePool": global_average_pool_case, "BatchNormalization": batch_norm_case,
    "LayerNormalization": layer_norm_case, "InstanceNormalization": instance_norm_case,
    "RNN": recurrent("RNN", 1, 1), "LSTM": recurrent("LSTM", 4, 2),
    "GRU": recurrent("GRU", 3, 1, linear_before_reset=lambda rng: int(rng.integers(0, 2))),
    "SoftmaxCrossEntropyLoss": softmax_cross_entropy_case,
    "Pad": pad_case, "Split": split_case, "Abs": relu_like("Abs"), "Max": variadic("Max"),
    "Min": variadic("Min"), "Mean": variadic("Mean"), "Softplus": unary("Softplus"),
    "Elu": relu_like("Elu", alpha=0.7), "HardSigmoid": hard_case("HardSigmoid"),
    "HardSwish": hard_case("HardSwish"), "CastLike": cast_like_case,
    "Sin": unary("Sin"), "Cos": unary("Cos"), "Softsign": unary("Softsign"),
    "Mish": mish_case, "PRelu": prelu_case, "Tile": tile_case, "CumSum": cum_sum_case,
    "GatherElements": gather_elements_case, "DepthToSpace": depth_to_space_case,
    "SpaceToDepth": space_to_depth_case, "Einsum": einsum_case,
    "ReduceMax": reduce_case("ReduceMax"), "ReduceMin": reduce_case("ReduceMin"),
    "ReduceSumSquare": reduce_case("ReduceSumSquare"), "ReduceL2": reduce_case("ReduceL2"),
    "ReduceLogSumExp": reduce_case("ReduceLogSumExp"), "Resize": resize_case,
    "TopK": top_k_case, "GatherND": gather_nd_case, "Mod": mod_case,
    "Tan": unary("Tan", inside_unit),
    "Sinh": unary("Sinh"), "Cosh": unary("Cosh"), "Asin": unary("Asin", inside_unit),
    "Acos": unary("Acos", inside_unit), "Atan": unary("Atan"), "Asinh": unary("Asinh"),
    "Acosh": unary("Acosh", above_one), "Atanh": unary("Atanh", inside_unit),
    "Trilu": trilu_case, "GlobalMaxPool": global_max_pool_case,
    "ScatterND": scatter_case("ScatterND"), "ScatterElements": scatter_case("ScatterElements"),
    "LRN": lrn_case, "ReduceL1": reduce_case("ReduceL1"), "ReduceProd": reduce_prod_case,
    "GridSample": grid_sample_case, "Col2Im": col2im_case,
    "LpNormalization": lp_normalization_case, "MaxUnpool": max_unpool_case,
}
DRAWS = 3  # random shapes per rule and run


def test_every_rule_is_checked() -> None:
    assert set(rules()) == set(CASES)


@pytest.mark.parametrize("op", sorted(CASES))
def test_rule_matches_central_differences(op: str) -> None:
    rng = np.random.default_rng()
    for _ in range(DRAWS):
        check = CASES[op](rng)
        analytic = gradients(check.model, check.feeds, check.target, loss="mse")
        numeric = numeric_gradients(check.model, check.feeds, check.target, "mse")
        assert not mismatches(analytic, numeric), (op, onnx.printer.to_text(check.model.graph),
                                                   mismatches(analytic, numeric))


def test_an_average_pool_wider_than_its_input_spreads_over_the_input_alone() -> None:
    """HF's EfficientNet pools globally with a window as wide as its hidden size (1,280
    to 2,560) and ceil_mode: the rule spread the gradient with a kernel of ones that wide,
    channels x width x width (125 GiB at 2,560), and training failed with MemoryError.
    A window is cut to the padded input: the gradient is a global average pool's."""
    rng = np.random.default_rng()
    wide = 1 << 15  # 64 channels x wide x wide would be 512 GiB
    x = normal(rng, 2, 64, *shape_of(rng, 2, 2, 7)).astype(np.float32)
    pooled = {op: node_check(rng, op, {"x": x}, attrs) for op, attrs in (
        ("AveragePool", {"kernel_shape": [wide, wide], "strides": [wide, wide], "ceil_mode": 1,
                         "count_include_pad": int(rng.integers(0, 2))}),
        ("GlobalAveragePool", {}))}
    target = rng.standard_normal((2, 64, 1, 1))
    wanted, got = (gradients(check.model, check.feeds, target, loss="mse")["x"]
                   for check in pooled.values())
    np.testing.assert_allclose(got, wanted, rtol=1e-6, atol=1e-9)


def test_a_softmax_row_masked_whole_passes_no_gradient_as_pytorchs_safe_softmax() -> None:
    """torch's exporters write scaled_dot_product_attention's safe softmax as Softmax,
    then `where(isnan(y), 0, y)`: a row masked whole (every score -inf, as a padded
    query's) is NaN, then zeros. Its gradient was NaN, and so was every weight's before
    it (transformers' Llama and Qwen2 through the TorchScript exporter): it is none."""
    rng = np.random.default_rng()
    rows, cols = (int(n) for n in rng.integers(3, 6, 2))
    mask = np.where(rng.random((rows, cols)) < 0.3, -np.inf, 0.0)
    mask[int(rng.integers(rows))] = -np.inf  # one row masked whole
    nodes = [helper.make_node("MatMul", ["x", "w"], ["scores"]),
             helper.make_node("Add", ["scores", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
             helper.make_node("IsNaN", ["weights"], ["lost"]),
             helper.make_node("Where", ["lost", "zero", "weights"], ["y"])]
    feeds = {"x": normal(rng, rows, 4), "mask": mask, "zero": np.zeros(())}
    check = checked(rng, typed_model(nodes, {"w": normal(rng, 4, cols)}, ["y"], feeds), feeds)
    analytic = gradients(check.model, check.feeds, check.target, loss="mse")
    numeric = numeric_gradients(check.model, check.feeds, check.target, "mse")
    assert np.isfinite(analytic["w"]).all() and not mismatches(analytic, numeric), \
        mismatches(analytic, numeric)
