"""Exp: dx = dy * y."""

from runtime.train.registry import Grad, gradient


@gradient("Exp")
def exp(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    return {0: g.e.op("Mul", [dy, g.y()])}
