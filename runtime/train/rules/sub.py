"""Sub: a - b; b's gradient is negated."""

from runtime.train.registry import Grad, gradient


@gradient("Sub")
def sub(g: Grad) -> dict[int, str]:
    dy, out = g.dy(), g.shape(g.y())
    assert dy is not None
    out_grads = {}
    if g.needs(0):
        out_grads[0] = g.e.unbroadcast(dy, out, g.shape(g.x(0)))
    if g.needs(1):
        out_grads[1] = g.e.op("Neg", [g.e.unbroadcast(dy, out, g.shape(g.x(1)))])
    return out_grads
