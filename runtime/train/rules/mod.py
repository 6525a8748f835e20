"""Mod: y = a - n * b, n the quotient a / b rounded toward zero (fmod 1, what floats take)
or down (fmod 0); da = dy, db = -dy * n. n is a step function of a and b: nothing flows
through it."""

from runtime.train.registry import Grad, gradient


@gradient("Mod")
def mod(g: Grad) -> dict[int, str]:
    dy, out, e = g.dy(), g.shape(g.y()), g.e
    assert dy is not None
    out_grads = {}
    if g.needs(0):
        out_grads[0] = e.unbroadcast(dy, out, g.shape(g.x(0)))
    if g.needs(1):
        ratio = e.op("Div", [g.x(0), g.x(1)])
        n = e.op("Mul", [e.op("Sign", [ratio]), e.op("Floor", [e.op("Abs", [ratio])])]) \
            if g.attr("fmod", 0) else e.op("Floor", [ratio])
        scaled = e.op("Mul", [dy, n])
        out_grads[1] = e.op("Neg", [e.unbroadcast(scaled, out, g.shape(g.x(1)))])
    return out_grads
