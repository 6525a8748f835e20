"""LayerNormalization over the axes from `axis` on: with xhat = (x - mean) * inv (inv the
reciprocal standard deviation, recomputed here in x's own type rather than read from the
node's optional outputs, which onnx keeps in float32),

    dxhat = dy * scale
    dx = inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    dscale = sum of dy * xhat, dbias = sum of dy, over the axes they were broadcast on.
"""

from __future__ import annotations

from runtime.errors import TrainingError
from runtime.train.registry import Grad, gradient


@gradient("LayerNormalization")
def layer_normalization(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    if any(g.dy(i) is not None for i in (1, 2)) and len(g.node.output) > 1:
        raise TrainingError(f"node {g.node.name} (LayerNormalization): training reads only "
                            f"its first output")
    shape = g.shape(x)
    axes = list(range(g.attr("axis", -1) % len(shape), len(shape)))
    eps = g.const(g.attr("epsilon", 1e-5), x)
    centred = e.op("Sub", [x, e.mean(x, axes)])
    var = e.mean(e.op("Mul", [centred, centred]), axes)
    inv = e.op("Reciprocal", [e.op("Sqrt", [e.op("Add", [var, eps])])])
    xhat = e.op("Mul", [centred, inv])
    grads = {}
    if g.needs(0):
        dxhat = e.op("Mul", [dy, g.x(1)])
        mean_d = e.mean(dxhat, axes)
        mean_dx = e.mean(e.op("Mul", [dxhat, xhat]), axes)
        inner = e.op("Sub", [e.op("Sub", [dxhat, mean_d]), e.op("Mul", [xhat, mean_dx])])
        grads[0] = e.op("Mul", [inv, inner])
    if g.needs(1):
        grads[1] = e.unbroadcast(e.op("Mul", [dy, xhat]), shape, g.shape(g.x(1)))
    if g.has(2) and g.needs(2):
        grads[2] = e.unbroadcast(dy, shape, g.shape(g.x(2)))
    return grads
