"""Cast between float types: the gradient is cast back to the input's type."""

from onnx import helper

from runtime.train.registry import Grad, gradient


@gradient("Cast")
def cast(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    to = helper.np_dtype_to_tensor_dtype(g.facts.dtype(g.x()))
    return {0: g.e.op("Cast", [dy], to=to)}
