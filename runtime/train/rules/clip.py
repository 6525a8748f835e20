"""Clip: the gradient passes where min <= x <= max (PyTorch's clamp); min and max get what
fell below and above them."""

from runtime.train.registry import Grad, gradient


@gradient("Clip")
def clip(g: Grad) -> dict[int, str]:
    dy, x, out, e = g.dy(), g.x(), g.shape(g.y()), g.e
    assert dy is not None
    zero = g.const(0, x)
    low = e.op("Less", [x, g.x(1)]) if g.has(1) else None
    high = e.op("Greater", [x, g.x(2)]) if g.has(2) else None
    passes = dy
    for outside in (low, high):
        if outside is not None:
            passes = e.op("Where", [outside, zero, passes])
    grads = {0: passes}
    for i, outside in ((1, low), (2, high)):
        if g.needs(i) and outside is not None:
            grads[i] = e.unbroadcast(e.op("Where", [outside, dy, zero]), out, g.shape(g.x(i)))
    return grads
