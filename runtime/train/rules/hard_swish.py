"""HardSwish: y = x * clip(x / 6 + 1/2, 0, 1); slope 0 below -3, 1 above 3, x / 3 + 1/2
between."""

from runtime.train.registry import Grad, gradient


@gradient("HardSwish")
def hard_swish(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    middle = e.op("Add", [e.op("Div", [x, g.const(3, x)]), g.const(0.5, x)])
    slope = e.op("Where", [e.op("Greater", [x, g.const(3, x)]), g.const(1, x),
                           e.op("Where", [e.op("Less", [x, g.const(-3, x)]), g.const(0, x),
                                          middle])])
    return {0: e.op("Mul", [dy, slope])}
