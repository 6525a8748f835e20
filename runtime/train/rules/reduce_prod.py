"""ReduceProd: each element's gradient is dy times the product of the others in its
reduction: the product of the non-zero ones over itself where none of the others is
zero, else 0 (a zero's is the product of the rest when it is the only one), as PyTorch's
prod takes zeros."""

from onnx import helper

from runtime.train.registry import Grad, gradient
from runtime.train.rules._reduce import reduced_axes, spread_back


@gradient("ReduceProd")
def reduce_prod(g: Grad) -> dict[int, str]:
    axes, e, x = reduced_axes(g), g.e, g.x()
    elem = helper.np_dtype_to_tensor_dtype(g.facts.dtype(x))
    is_zero = e.op("Equal", [x, g.const(0, x)])
    nonzero = e.op("Where", [is_zero, g.const(1, x), x])
    product = e.reduce("ReduceProd", nonzero, axes, keepdims=True)
    zeros = e.op("Cast", [is_zero], to=elem)
    others_zero = e.op("Sub", [e.sum(zeros, axes, keepdims=True), zeros])
    alone = e.op("Cast", [e.op("Equal", [others_zero, g.const(0, x)])], to=elem)
    others = e.op("Mul", [e.op("Div", [product, nonzero]), alone])
    return {0: e.op("Mul", [spread_back(g, axes), others])}
