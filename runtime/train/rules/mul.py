"""Mul: a * b; each operand's gradient is the output's times the other operand."""

from runtime.train.registry import Grad, gradient


@gradient("Mul")
def mul(g: Grad) -> dict[int, str]:
    dy, out = g.dy(), g.shape(g.y())
    assert dy is not None
    return {i: g.e.unbroadcast(g.e.op("Mul", [dy, g.x(1 - i)]), out, g.shape(g.x(i)))
            for i in (0, 1) if g.needs(i)}
