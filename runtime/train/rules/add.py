"""Add: each operand gets the output's gradient, summed over the axes it was broadcast on."""

from runtime.train.registry import Grad, gradient


@gradient("Add")
def add(g: Grad) -> dict[int, str]:
    dy, out = g.dy(), g.shape(g.y())
    assert dy is not None
    return {i: g.e.unbroadcast(dy, out, g.shape(g.x(i))) for i in (0, 1) if g.needs(i)}
