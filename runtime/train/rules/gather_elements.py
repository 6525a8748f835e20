"""GatherElements: the output's gradient added back at the gathered positions
(ScatterElements with reduction add; repeated indices add up, negative ones count from
the end there as well)."""

from onnx import TensorProto

from runtime.train.registry import Grad, gradient
from runtime.train.rules._shared import added_at


@gradient("GatherElements")
def gather_elements(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    shape = g.shape(g.x())
    index = e.op("Cast", [g.x(1)], to=TensorProto.INT64)
    return {0: added_at(g, "ScatterElements", shape, g.x(), index, dy,
                        axis=g.attr("axis", 0) % len(shape))}
