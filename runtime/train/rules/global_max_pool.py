"""GlobalMaxPool: ReduceMax over the spatial axes (see `_reduce.to_reduced_extremes`)."""

from runtime.train.registry import Grad, gradient
from runtime.train.rules._reduce import to_reduced_extremes


@gradient("GlobalMaxPool")
def global_max_pool(g: Grad) -> dict[int, str]:
    return to_reduced_extremes(g, list(range(2, len(g.shape(g.x())))))
