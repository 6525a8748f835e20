"""GatherND: the output's gradient added back at the gathered positions (ScatterND with
reduction add; repeated indices add up, negative ones count from the end there as well).
With `batch_dims` b, the first b axes of data and indices are one batch axis of their
product, and each index tuple is led by its batch position: GatherND with batch_dims 0."""

import math

import numpy as np
from onnx import TensorProto

from runtime.train.registry import Grad, gradient
from runtime.train.rules._shared import added_at


@gradient("GatherND")
def gather_nd(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    data, where = g.shape(g.x()), g.shape(g.x(1))
    index = e.op("Cast", [g.x(1)], to=TensorProto.INT64)
    batch_dims = g.attr("batch_dims", 0)
    if not batch_dims:
        return {0: added_at(g, "ScatterND", data, g.x(), index, dy)}
    batches = math.prod(data[:batch_dims])
    middle = where[batch_dims:-1]
    position = np.broadcast_to(np.arange(batches).reshape(-1, *[1] * (len(middle) + 1)),
                               (batches, *middle, 1))
    index = e.op("Concat", [e.const(position, np.int64),
                            e.reshape(index, (batches, *where[batch_dims:]))], axis=-1)
    flat = (batches, *data[batch_dims:])
    dy_flat = e.reshape(dy, (batches, *g.shape(g.y())[batch_dims:]))
    summed = added_at(g, "ScatterND", flat, g.x(), index, dy_flat)
    return {0: e.reshape(summed, data)}
