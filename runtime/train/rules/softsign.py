"""Softsign: y = x / (1 + |x|), dx = dy / (1 + |x|)^2."""

from runtime.train.registry import Grad, gradient


@gradient("Softsign")
def softsign(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    grow = e.op("Add", [g.const(1, x), e.op("Abs", [x])])
    return {0: e.op("Div", [dy, e.op("Mul", [grow, grow])])}
