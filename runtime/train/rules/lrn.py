"""LRN (AlexNet's local response normalization) rewritten into ai.onnx ops whose rules give
its gradient: y = x / (bias + alpha / size * s)^beta, s each channel's window of squares
(channels c - floor((size-1)/2) to c + ceil((size-1)/2)), summed by a Conv of ones along
the channels."""

from __future__ import annotations

import numpy as np

from runtime.train.registry import Rewriting, rewrite


@rewrite("LRN")
def lrn(r: Rewriting) -> dict[str, str]:
    e, x = r.e, r.node.input[0]
    shape = r.shape(x)
    size = int(r.attr("size"))
    below = (size - 1) // 2
    planes = e.reshape(e.op("Mul", [x, x]), [shape[0], 1, shape[1], -1])
    window = e.op("Conv", [planes, r.const(np.ones((1, 1, size, 1)), x)],
                  pads=[below, 0, size - 1 - below, 0])
    scale = e.op("Add", [r.const(r.attr("bias", 1.0), x), e.op("Mul", [
        r.const(r.attr("alpha", 1e-4) / size, x), e.reshape(window, shape)])])
    e.ops("Div", [x, e.op("Pow", [scale, r.const(r.attr("beta", 0.75), x)])],
          [r.node.output[0]])
    return {}
