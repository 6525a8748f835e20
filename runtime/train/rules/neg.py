"""Neg: dx = -dy."""

from runtime.train.registry import Grad, gradient


@gradient("Neg")
def neg(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    return {0: g.e.op("Neg", [dy])}
