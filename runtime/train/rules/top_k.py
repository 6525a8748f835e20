"""TopK: each value's gradient goes back to where it was taken from (ScatterElements of
the values' gradient at the indices; the indices carry none)."""

from runtime.train.registry import Grad, gradient
from runtime.train.rules._shared import zeros


@gradient("TopK")
def top_k(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    shape = g.shape(g.x())
    return {0: g.e.op("ScatterElements", [zeros(g, shape, g.x()), g.y(1), dy],
                      axis=g.attr("axis", -1) % len(shape))}
