"""ReduceL2: y = sqrt(sum x^2), dx = dy x / y, dy and y spread back over the reduced axes."""

from runtime.train.registry import Grad, gradient
from runtime.train.rules._reduce import kept, reduced_axes, spread_back


@gradient("ReduceL2")
def reduce_l2(g: Grad) -> dict[int, str]:
    axes, e = reduced_axes(g), g.e
    share = e.op("Div", [g.x(), kept(g, g.y(), axes)])
    return {0: e.op("Mul", [spread_back(g, axes), share])}
