"""Relu: the gradient passes where the input was positive (0 at 0, as PyTorch)."""

from runtime.train.registry import Grad, gradient


@gradient("Relu")
def relu(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    zero = g.const(0, x)
    return {0: e.op("Where", [e.op("Greater", [x, zero]), dy, zero])}
