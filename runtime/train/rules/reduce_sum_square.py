"""ReduceSumSquare: dx = 2 x dy, dy spread back over the reduced axes."""

from runtime.train.registry import Grad, gradient
from runtime.train.rules._reduce import reduced_axes, spread_back


@gradient("ReduceSumSquare")
def reduce_sum_square(g: Grad) -> dict[int, str]:
    twice = g.e.op("Mul", [g.x(), g.const(2, g.x())])
    return {0: g.e.op("Mul", [spread_back(g, reduced_axes(g)), twice])}
