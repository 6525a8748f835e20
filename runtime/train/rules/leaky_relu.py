"""LeakyRelu: slope 1 above zero, `alpha` elsewhere."""

from runtime.train.registry import Grad, gradient


@gradient("LeakyRelu")
def leaky_relu(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    slope = e.op("Mul", [dy, g.const(g.attr("alpha", 0.01), x)])
    return {0: e.op("Where", [e.op("Greater", [x, g.const(0, x)]), dy, slope])}
