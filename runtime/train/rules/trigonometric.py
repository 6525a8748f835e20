"""The trigonometric and hyperbolic functions and their inverses: dx = dy * f'(x), each
derivative written from x (Tan's from y: 1 + tan^2)."""

from __future__ import annotations

from collections.abc import Callable

from runtime.train.emit import Emitter
from runtime.train.registry import Grad, gradient

# op -> (emitter, x, y, one) -> the derivative, or (for the inverses) its reciprocal
_DERIVATIVES: dict[str, Callable[[Emitter, str, str, str], str]] = {
    "Sin": lambda e, x, y, one: e.op("Cos", [x]),
    "Cos": lambda e, x, y, one: e.op("Neg", [e.op("Sin", [x])]),
    "Tan": lambda e, x, y, one: e.op("Add", [one, e.op("Mul", [y, y])]),
    "Sinh": lambda e, x, y, one: e.op("Cosh", [x]),
    "Cosh": lambda e, x, y, one: e.op("Sinh", [x]),
}
_INVERSE_SLOPES: dict[str, Callable[[Emitter, str, str, str], str]] = {  # 1 / f'(x)
    "Asin": lambda e, x, y, one: e.op("Sqrt", [e.op("Sub", [one, e.op("Mul", [x, x])])]),
    "Acos": lambda e, x, y, one: e.op("Neg", [e.op("Sqrt", [e.op("Sub", [
        one, e.op("Mul", [x, x])])])]),
    "Atan": lambda e, x, y, one: e.op("Add", [one, e.op("Mul", [x, x])]),
    "Asinh": lambda e, x, y, one: e.op("Sqrt", [e.op("Add", [e.op("Mul", [x, x]), one])]),
    "Acosh": lambda e, x, y, one: e.op("Sqrt", [e.op("Sub", [e.op("Mul", [x, x]), one])]),
    "Atanh": lambda e, x, y, one: e.op("Sub", [one, e.op("Mul", [x, x])]),
}


@gradient(*_DERIVATIVES, *_INVERSE_SLOPES)
def trigonometric(g: Grad) -> dict[int, str]:
    dy, x, e, op = g.dy(), g.x(), g.e, g.node.op_type
    assert dy is not None
    one = g.const(1, x)
    if op in _DERIVATIVES:
        return {0: e.op("Mul", [dy, _DERIVATIVES[op](e, x, g.y(), one)])}
    return {0: e.op("Div", [dy, _INVERSE_SLOPES[op](e, x, g.y(), one)])}
