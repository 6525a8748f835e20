"""Gelu (opset 20): exact, x * Phi(x), whose slope is Phi(x) + x * phi(x); or its tanh
approximation, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3)."""

import math

from runtime.train.registry import Grad, gradient

_CUBIC = 0.044715


@gradient("Gelu")
def gelu(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None

    def c(v: float) -> str:
        return g.const(v, x)

    square = e.op("Mul", [x, x])
    if g.attr("approximate", "none") == "tanh":
        k = math.sqrt(2 / math.pi)
        inner = e.op("Mul", [c(k), e.op("Add", [x, e.op("Mul", [c(_CUBIC), e.op(
            "Mul", [square, x])])])])
        t = e.op("Tanh", [inner])
        half_one_plus_t = e.op("Mul", [c(0.5), e.op("Add", [c(1), t])])
        du = e.op("Mul", [c(k), e.op("Add", [c(1), e.op("Mul", [c(3 * _CUBIC), square])])])
        sech2 = e.op("Sub", [c(1), e.op("Mul", [t, t])])
        slope = e.op("Add", [half_one_plus_t, e.op("Mul", [e.op("Mul", [c(0.5), x]),
                                                            e.op("Mul", [sech2, du])])])
    else:
        cdf = e.op("Mul", [c(0.5), e.op("Add", [c(1), e.op("Erf", [
            e.op("Mul", [x, c(1 / math.sqrt(2))])])])])
        pdf = e.op("Mul", [c(1 / math.sqrt(2 * math.pi)),
                           e.op("Exp", [e.op("Mul", [square, c(-0.5)])])])
        slope = e.op("Add", [cdf, e.op("Mul", [x, pdf])])
    return {0: e.op("Mul", [dy, slope])}
