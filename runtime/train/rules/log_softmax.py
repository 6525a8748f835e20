"""LogSoftmax (one axis, opset 13 on): dx = dy - exp(y) * sum(dy, axis)."""

from runtime.train.registry import Grad, gradient


@gradient("LogSoftmax")
def log_softmax(g: Grad) -> dict[int, str]:
    dy, y, e = g.dy(), g.y(), g.e
    assert dy is not None
    axis = g.attr("axis", -1) % len(g.shape(y))
    total = e.sum(dy, [axis], keepdims=True)
    return {0: e.op("Sub", [dy, e.op("Mul", [e.op("Exp", [y]), total])])}
