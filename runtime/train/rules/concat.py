"""Concat: each input's gradient is its slice of the output's along the axis."""

from runtime.train.registry import Grad, gradient


@gradient("Concat")
def concat(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    axis = g.attr("axis") % len(g.shape(g.y()))
    grads, start = {}, 0
    for i, x in enumerate(g.node.input):
        size = g.shape(x)[axis]
        if g.needs(i):
            grads[i] = e.op("Slice", [dy, e.ints([start]), e.ints([start + size]),
                                      e.ints([axis])])
        start += size
    return grads
