"""HardSigmoid: y = clip(alpha x + beta, 0, 1); slope alpha where it is not clipped."""

from runtime.train.registry import Grad, gradient


@gradient("HardSigmoid")
def hard_sigmoid(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    alpha, beta = g.attr("alpha", 0.2), g.attr("beta", 0.5)
    inner = e.op("Add", [e.op("Mul", [x, g.const(alpha, x)]), g.const(beta, x)])
    inside = e.op("And", [e.op("Greater", [inner, g.const(0, x)]),
                          e.op("Less", [inner, g.const(1, x)])])
    return {0: e.op("Where", [inside, e.op("Mul", [dy, g.const(alpha, x)]), g.const(0, x)])}
