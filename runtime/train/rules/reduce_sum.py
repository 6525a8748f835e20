"""ReduceSum: every input element gets its sum's gradient."""

from runtime.train.registry import Grad, gradient
from runtime.train.rules._reduce import reduced_axes, spread_back


@gradient("ReduceSum")
def reduce_sum(g: Grad) -> dict[int, str]:
    return {0: spread_back(g, reduced_axes(g))}
