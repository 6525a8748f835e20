"""Softmax (one axis, opset 13 on): dx = y * (dy - sum(dy * y, axis)). A row whose output
is NaN (every input -inf: an attention row masked whole) is taken as the zeros torch's
exporters make of it after (`where(isnan(y), 0, y)`, the safe softmax of
scaled_dot_product_attention), so it passes no gradient, as PyTorch's `_safe_softmax`
passes none; taken as NaN, it made every weight before it NaN."""

from runtime.train.registry import Grad, gradient


@gradient("Softmax")
def softmax(g: Grad) -> dict[int, str]:
    dy, y, e = g.dy(), g.y(), g.e
    assert dy is not None
    axis = g.attr("axis", -1) % len(g.shape(y))
    y = e.op("Where", [e.op("IsNaN", [y]), e.const(0, g.facts.dtype(y)), y])
    inner = e.sum(e.op("Mul", [dy, y]), [axis], keepdims=True)
    return {0: e.op("Mul", [y, e.op("Sub", [dy, inner])])}
