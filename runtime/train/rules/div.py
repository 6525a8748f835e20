"""Div: y = a / b; da = dy / b, db = -dy * y / b."""

from runtime.train.registry import Grad, gradient


@gradient("Div")
def div(g: Grad) -> dict[int, str]:
    dy, out, e = g.dy(), g.shape(g.y()), g.e
    assert dy is not None
    b = g.x(1)
    out_grads = {}
    if g.needs(0):
        out_grads[0] = e.unbroadcast(e.op("Div", [dy, b]), out, g.shape(g.x(0)))
    if g.needs(1):
        scaled = e.op("Div", [e.op("Mul", [dy, g.y()]), b])
        out_grads[1] = e.op("Neg", [e.unbroadcast(scaled, out, g.shape(b))])
    return out_grads
