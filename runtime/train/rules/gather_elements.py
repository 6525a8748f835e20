"""GatherElements: the output's gradient added back at the gathered positions
(ScatterElements with reduction add; repeated indices add up). Negative indices count
from the end."""

import numpy as np
from onnx import TensorProto

from runtime.train.registry import Grad, gradient
from runtime.train.rules._shared import zeros


@gradient("GatherElements")
def gather_elements(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    shape = g.shape(g.x())
    axis = g.attr("axis", 0) % len(shape)
    index = e.op("Cast", [g.x(1)], to=TensorProto.INT64)
    size, zero = e.const(shape[axis], np.int64), e.const(0, np.int64)
    index = e.op("Where", [e.op("Less", [index, zero]), e.op("Add", [index, size]), index])
    return {0: e.op("ScatterElements", [zeros(g, shape, g.x()), index, dy], axis=axis,
                    reduction="add")}
