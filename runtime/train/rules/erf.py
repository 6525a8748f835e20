"""Erf: dx = dy * 2/sqrt(pi) * exp(-x^2) (what a Gelu written out as Erf needs)."""

import math

from runtime.train.registry import Grad, gradient


@gradient("Erf")
def erf(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    bell = e.op("Exp", [e.op("Neg", [e.op("Mul", [x, x])])])
    return {0: e.op("Mul", [dy, e.op("Mul", [bell, g.const(2 / math.sqrt(math.pi), x)])])}
