"""ReduceLogSumExp: dx = dy exp(x - y), dy and y spread back over the reduced axes (the
softmax of x over them)."""

from runtime.train.registry import Grad, gradient
from runtime.train.rules._reduce import kept, reduced_axes, spread_back


@gradient("ReduceLogSumExp")
def reduce_log_sum_exp(g: Grad) -> dict[int, str]:
    axes, e = reduced_axes(g), g.e
    weights = e.op("Exp", [e.op("Sub", [g.x(), kept(g, g.y(), axes)])])
    return {0: e.op("Mul", [spread_back(g, axes), weights])}
