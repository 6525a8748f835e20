"""Expand: the input's gradient is the output's, summed over the broadcast axes."""

from runtime.train.registry import Grad, gradient


@gradient("Expand")
def expand(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    return {0: g.e.unbroadcast(dy, g.shape(g.y()), g.shape(g.x()))}
