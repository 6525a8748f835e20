"""Softmax (one axis, opset 13 on): dx = y * (dy - sum(dy * y, axis))."""

from runtime.train.registry import Grad, gradient


@gradient("Softmax")
def softmax(g: Grad) -> dict[int, str]:
    dy, y, e = g.dy(), g.y(), g.e
    assert dy is not None
    axis = g.attr("axis", -1) % len(g.shape(y))
    inner = e.sum(e.op("Mul", [dy, y]), [axis], keepdims=True)
    return {0: e.op("Mul", [y, e.op("Sub", [dy, inner])])}
