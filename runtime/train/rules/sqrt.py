"""Sqrt: dx = dy / (2 y)."""

from runtime.train.registry import Grad, gradient


@gradient("Sqrt")
def sqrt(g: Grad) -> dict[int, str]:
    dy, y, e = g.dy(), g.y(), g.e
    assert dy is not None
    return {0: e.op("Div", [e.op("Mul", [dy, g.const(0.5, y)]), y])}
