"""Pow: y = a^b; da = dy * b * a^(b-1), db = dy * y * log(a). An integer exponent is cast
to the base's type first."""

from onnx import helper

from runtime.train.registry import Grad, gradient


@gradient("Pow")
def pow_(g: Grad) -> dict[int, str]:
    dy, out, e = g.dy(), g.shape(g.y()), g.e
    assert dy is not None
    a, b = g.x(0), g.x(1)
    dtype = g.facts.dtype(a)
    if g.facts.dtype(b) != dtype:
        b = e.op("Cast", [b], to=helper.np_dtype_to_tensor_dtype(dtype))
    grads = {}
    if g.needs(0):
        slope = e.op("Mul", [b, e.op("Pow", [a, e.op("Sub", [b, g.const(1, a)])])])
        grads[0] = e.unbroadcast(e.op("Mul", [dy, slope]), out, g.shape(g.x(0)))
    if g.needs(1):
        slope = e.op("Mul", [g.y(), e.op("Log", [a])])
        grads[1] = e.unbroadcast(e.op("Mul", [dy, slope]), out, g.shape(g.x(1)))
    return grads
