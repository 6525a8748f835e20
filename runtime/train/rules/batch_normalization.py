"""BatchNormalization, trained with batch statistics (PyTorch's `train()` mode): the node
is rewritten into ai.onnx ops computing each channel's mean and variance over the batch
and space, whose rules give its gradient. The running statistics are updated as ONNX's
training mode says, running = momentum * running + (1 - momentum) * batch, with the
variance unbiased as PyTorch keeps it; the trainer writes them back after each forward.
"""

from __future__ import annotations

import math

from runtime.train.registry import Rewriting, rewrite
from runtime.train.rules._normalize import normalize


@rewrite("BatchNormalization")
def batch_normalization(r: Rewriting) -> dict[str, str]:
    e, node = r.e, r.node
    x, mean_in, var_in = node.input[0], node.input[3], node.input[4]
    shape = r.shape(x)
    stats = normalize(r, [0, *range(2, len(shape))])
    momentum = r.attr("momentum", 0.9)
    count = math.prod(shape) // shape[1]
    unbiased = e.op("Mul", [stats.var, r.const(count / max(count - 1, 1), x)])
    keep, take = r.const(momentum, x), r.const(1 - momentum, x)
    updated = {}
    for running, batch in ((mean_in, stats.mean), (var_in, unbiased)):
        updated[running] = e.op("Add", [e.op("Mul", [running, keep]), e.op(
            "Mul", [e.reshape(batch, [shape[1]]), take])])
    for out, running in zip(node.output[1:3], (mean_in, var_in), strict=False):
        if out:  # training_mode's running outputs, if the model reads them
            e.ops("Identity", [updated[running]], [out])
    return updated
