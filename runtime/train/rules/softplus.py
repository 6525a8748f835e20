"""Softplus: y = log(1 + exp(x)), dx = dy * sigmoid(x)."""

from runtime.train.registry import Grad, gradient


@gradient("Softplus")
def softplus(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    return {0: g.e.op("Mul", [dy, g.e.op("Sigmoid", [g.x()])])}
