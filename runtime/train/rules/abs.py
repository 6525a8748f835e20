"""Abs: dx = dy * sign(x)."""

from runtime.train.registry import Grad, gradient


@gradient("Abs")
def abs_(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    return {0: g.e.op("Mul", [dy, g.e.op("Sign", [g.x()])])}
