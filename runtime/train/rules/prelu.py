"""PRelu: y = x above zero, slope * x below (slope broadcast to x). dx = dy or dy * slope;
dslope = dy * x below zero, summed back to the slope's shape."""

from runtime.train.registry import Grad, gradient


@gradient("PRelu")
def prelu(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    x, slope = g.x(0), g.x(1)
    below = e.op("Less", [x, g.const(0, x)])
    grads = {}
    if g.needs(0):
        grads[0] = e.op("Where", [below, e.op("Mul", [dy, slope]), dy])
    if g.needs(1):
        part = e.op("Where", [below, e.op("Mul", [dy, x]), g.const(0, x)])
        grads[1] = e.unbroadcast(part, g.shape(x), g.shape(slope))
    return grads
