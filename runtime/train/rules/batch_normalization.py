"""BatchNormalization, trained with batch statistics (PyTorch's `train()` mode): the node
is rewritten into ai.onnx ops computing each channel's mean and variance over the batch
and space, whose rules give its gradient. The running statistics are updated as ONNX's
training mode says, running = momentum * running + (1 - momentum) * batch, with the
variance unbiased as PyTorch keeps it; the trainer writes them back after each forward.
"""

from __future__ import annotations

import math

from runtime.train.registry import Rewriting, rewrite


@rewrite("BatchNormalization")
def batch_normalization(r: Rewriting) -> dict[str, str]:
    e, node = r.e, r.node
    x, scale, bias, mean_in, var_in = node.input[:5]
    shape = r.shape(x)
    axes = [0, *range(2, len(shape))]
    per_channel = [1, shape[1], *[1] * (len(shape) - 2)]
    eps, momentum = r.attr("epsilon", 1e-5), r.attr("momentum", 0.9)
    mean = e.mean(x, axes)
    centred = e.op("Sub", [x, mean])
    var = e.mean(e.op("Mul", [centred, centred]), axes)
    inv = e.op("Reciprocal", [e.op("Sqrt", [e.op("Add", [var, r.const(eps, x)])])])
    normed = e.op("Mul", [centred, inv])
    scaled = e.op("Mul", [normed, e.reshape(scale, per_channel)])
    e.ops("Add", [scaled, e.reshape(bias, per_channel)], [node.output[0]])
    count = math.prod(shape) // shape[1]
    unbiased = e.op("Mul", [var, r.const(count / max(count - 1, 1), x)])
    keep, take = r.const(momentum, x), r.const(1 - momentum, x)
    updated = {}
    for running, batch in ((mean_in, mean), (var_in, unbiased)):
        updated[running] = e.op("Add", [e.op("Mul", [running, keep]), e.op(
            "Mul", [e.reshape(batch, [shape[1]]), take])])
    for out, running in zip(node.output[1:3], (mean_in, var_in), strict=False):
        if out:  # training_mode's running outputs, if the model reads them
            e.ops("Identity", [updated[running]], [out])
    return updated
