"""MaxUnpool: each input element went to the output position its index names (counted
over the whole output, as MaxPool counts them), so its gradient is the output's gradient
there: GatherElements of the flattened gradient."""

from onnx import TensorProto

from runtime.train.registry import Grad, gradient


@gradient("MaxUnpool")
def max_unpool(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    where = e.reshape(e.op("Cast", [g.x(1)], to=TensorProto.INT64), [-1])
    taken = e.op("GatherElements", [e.reshape(dy, [-1]), where], axis=0)
    return {0: e.reshape(taken, g.shape(g.x()))}
