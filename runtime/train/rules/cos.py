"""Cos: dx = -dy * sin(x)."""

from runtime.train.registry import Grad, gradient


@gradient("Cos")
def cos(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    return {0: g.e.op("Neg", [g.e.op("Mul", [dy, g.e.op("Sin", [g.x()])])])}
