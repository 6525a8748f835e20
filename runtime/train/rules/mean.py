"""Mean (elementwise, of any number of operands): each gets the output's gradient over
their count, unbroadcast."""

from runtime.train.registry import Grad, gradient


@gradient("Mean")
def mean(g: Grad) -> dict[int, str]:
    dy, out, e = g.dy(), g.shape(g.y()), g.e
    assert dy is not None
    share = e.op("Div", [dy, g.const(len(g.node.input), g.y())])
    return {i: e.unbroadcast(share, out, g.shape(x)) for i, x in enumerate(g.node.input)
            if g.needs(i)}
