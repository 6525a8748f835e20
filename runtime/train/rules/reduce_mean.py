"""ReduceMean: every input element gets its mean's gradient over the count averaged."""

import math

from runtime.train.registry import Grad, gradient
from runtime.train.rules._reduce import reduced_axes, spread_back


@gradient("ReduceMean")
def reduce_mean(g: Grad) -> dict[int, str]:
    axes = reduced_axes(g)
    count = math.prod(g.shape(g.x())[a] for a in axes)
    return {0: g.e.op("Div", [spread_back(g, axes), g.const(count, g.x())])}
