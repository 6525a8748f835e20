"""Sigmoid: dx = dy * y * (1 - y)."""

from runtime.train.registry import Grad, gradient


@gradient("Sigmoid")
def sigmoid(g: Grad) -> dict[int, str]:
    dy, y, e = g.dy(), g.y(), g.e
    assert dy is not None
    return {0: e.op("Mul", [dy, e.op("Mul", [y, e.op("Sub", [g.const(1, y), y])])])}
