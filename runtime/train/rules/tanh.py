"""Tanh: dx = dy * (1 - y^2)."""

from runtime.train.registry import Grad, gradient


@gradient("Tanh")
def tanh(g: Grad) -> dict[int, str]:
    dy, y, e = g.dy(), g.y(), g.e
    assert dy is not None
    return {0: e.op("Mul", [dy, e.op("Sub", [g.const(1, y), e.op("Mul", [y, y])])])}
