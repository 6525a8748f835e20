"""ScatterND and ScatterElements (reduction none or add): the data's gradient is the
output's, where the updates overwrote it zeroed (none); the updates' gradient is the
output's gathered at their positions (GatherND, GatherElements). Repeated indices, whose
result onnx leaves undefined without a reduction, each get the position's gradient."""

from onnx import TensorProto

from runtime.errors import TrainingError
from runtime.train.registry import Grad, gradient
from runtime.train.rules._shared import zeros

_GATHER = {"ScatterND": "GatherND", "ScatterElements": "GatherElements"}


@gradient(*_GATHER)
def scatter(g: Grad) -> dict[int, str]:
    dy, e, op = g.dy(), g.e, g.node.op_type
    assert dy is not None
    reduction = g.attr("reduction", "none")
    if reduction not in ("none", "add"):
        raise TrainingError(f"node {g.node.name} ({op}): training takes reduction none or "
                            f"add, not {reduction}")
    axis = {"axis": g.attr("axis", 0)} if op == "ScatterElements" else {}
    index = e.op("Cast", [g.x(1)], to=TensorProto.INT64)
    grads = {}
    if g.needs(0):
        grads[0] = dy if reduction == "add" else e.op(
            op, [dy, index, zeros(g, g.shape(g.x(2)), g.x(2))], **axis)
    if g.needs(2):
        grads[2] = e.op(_GATHER[op], [dy, index], **axis)
    return grads
