"""Mish: y = x tanh(softplus(x)), dx = dy (t + x sigmoid(x) (1 - t^2)), t = tanh(softplus(x))."""

from runtime.train.registry import Grad, gradient


@gradient("Mish")
def mish(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    t = e.op("Tanh", [e.op("Softplus", [x])])
    slope = e.op("Sub", [g.const(1, x), e.op("Mul", [t, t])])
    inner = e.op("Add", [t, e.op("Mul", [e.op("Mul", [x, e.op("Sigmoid", [x])]), slope])])
    return {0: e.op("Mul", [dy, inner])}
