"""Sin: dx = dy * cos(x)."""

from runtime.train.registry import Grad, gradient


@gradient("Sin")
def sin(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    return {0: g.e.op("Mul", [dy, g.e.op("Cos", [g.x()])])}
