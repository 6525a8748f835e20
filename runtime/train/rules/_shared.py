"""What several rules share: the gradient of an op that only moves elements about (its
input's gradient is the output's, shaped back), and a zero tensor."""

from __future__ import annotations

import numpy as np

from runtime.train.registry import Grad


def shaped_back(g: Grad) -> dict[int, str]:
    """Reshape, Flatten, Squeeze, Unsqueeze, Identity: the same elements in another shape."""
    dy = g.dy()
    assert dy is not None
    return {0: g.e.reshape(dy, g.shape(g.x()))} if g.needs(0) else {}


def zeros(g: Grad, shape: tuple[int, ...], like: str, dtype: np.dtype | None = None) -> str:
    """A zero tensor of `shape` and `like`'s dtype, or `dtype` (ConstantOfShape: no big
    constant)."""
    from onnx import numpy_helper

    value = numpy_helper.from_array(np.zeros(1, dtype=g.facts.dtype(like) if dtype is None
                                             else dtype))
    return g.e.op("ConstantOfShape", [g.e.ints(shape)], value=value)


def added_at(g: Grad, op: str, shape: tuple[int, ...], like: str, index: str, updates: str,
             **attrs: int) -> str:
    """`op` (ScatterND or ScatterElements) adding `updates` at `index` into zeros of `shape`
    and `like`'s dtype, repeated indices adding up. onnxruntime's CPU kernels add no
    float16, so float16 updates are added in float and the sum cast back."""
    from onnx import TensorProto

    if g.facts.dtype(like) != np.float16:
        return g.e.op(op, [zeros(g, shape, like), index, updates], reduction="add", **attrs)
    wide = g.e.op("Cast", [updates], to=TensorProto.FLOAT)
    summed = g.e.op(op, [zeros(g, shape, like, np.dtype(np.float32)), index, wide],
                    reduction="add", **attrs)
    return g.e.op("Cast", [summed], to=TensorProto.FLOAT16)
