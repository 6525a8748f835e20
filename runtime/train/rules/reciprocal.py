"""Reciprocal: y = 1/x, dx = -dy * y^2."""

from runtime.train.registry import Grad, gradient


@gradient("Reciprocal")
def reciprocal(g: Grad) -> dict[int, str]:
    dy, y, e = g.dy(), g.y(), g.e
    assert dy is not None
    return {0: e.op("Neg", [e.op("Mul", [dy, e.op("Mul", [y, y])])])}
