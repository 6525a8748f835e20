"""Elu: slope 1 above zero, y + alpha below."""

from runtime.train.registry import Grad, gradient


@gradient("Elu")
def elu(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    below = e.op("Mul", [dy, e.op("Add", [g.y(), g.const(g.attr("alpha", 1.0), x)])])
    return {0: e.op("Where", [e.op("Greater", [x, g.const(0, x)]), dy, below])}
