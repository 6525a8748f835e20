"""Where(cond, a, b): a's gradient where cond holds, b's elsewhere, each unbroadcast."""

from runtime.train.registry import Grad, gradient


@gradient("Where")
def where(g: Grad) -> dict[int, str]:
    dy, out, e = g.dy(), g.shape(g.y()), g.e
    assert dy is not None
    cond, zero = g.x(0), g.const(0, g.y())
    grads = {}
    if g.needs(1):
        grads[1] = e.unbroadcast(e.op("Where", [cond, dy, zero]), out, g.shape(g.x(1)))
    if g.needs(2):
        grads[2] = e.unbroadcast(e.op("Where", [cond, zero, dy]), out, g.shape(g.x(2)))
    return grads
