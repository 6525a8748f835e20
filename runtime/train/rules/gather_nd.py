"""GatherND (batch_dims 0): the output's gradient added back at the gathered positions
(ScatterND with reduction add; repeated indices add up, negative ones count from the end
there as well)."""

from onnx import TensorProto

from runtime.errors import TrainingError
from runtime.train.registry import Grad, gradient
from runtime.train.rules._shared import zeros


@gradient("GatherND")
def gather_nd(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    if g.attr("batch_dims", 0):
        raise TrainingError(f"node {g.node.name} (GatherND): training takes batch_dims 0")
    index = e.op("Cast", [g.x(1)], to=TensorProto.INT64)
    return {0: e.op("ScatterND", [zeros(g, g.shape(g.x()), g.x()), index, dy],
                    reduction="add")}
