"""GlobalAveragePool: every input element gets its channel's gradient over the spatial
size."""

import math

from runtime.train.registry import Grad, gradient


@gradient("GlobalAveragePool")
def global_average_pool(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    shape = g.shape(x)
    spread = e.expand(dy, shape)
    return {0: e.op("Div", [spread, g.const(math.prod(shape[2:]), x)])}
