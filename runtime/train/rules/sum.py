"""Sum (of any number of operands): each gets the output's gradient, unbroadcast."""

from runtime.train.registry import Grad, gradient


@gradient("Sum")
def sum_(g: Grad) -> dict[int, str]:
    dy, out = g.dy(), g.shape(g.y())
    assert dy is not None
    return {i: g.e.unbroadcast(dy, out, g.shape(x)) for i, x in enumerate(g.node.input)
            if g.needs(i)}
