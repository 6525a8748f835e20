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


def zeros(g: Grad, shape: tuple[int, ...], like: str) -> str:
    """A zero tensor of `shape` and `like`'s dtype (ConstantOfShape: no big constant)."""
    from onnx import numpy_helper

    value = numpy_helper.from_array(np.zeros(1, dtype=g.facts.dtype(like)))
    return g.e.op("ConstantOfShape", [g.e.ints(shape)], value=value)
