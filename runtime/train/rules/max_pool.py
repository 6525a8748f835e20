"""MaxPool: each output's gradient goes to the input element it took. For training the
node also gives its argmax indices, counted over the whole tensor (onnxruntime and the
`reference` backend alike); repeated indices (overlapping windows) add up in
ScatterElements."""

from __future__ import annotations

from onnx import helper

from runtime.errors import TrainingError
from runtime.train.registry import Grad, Rewriting, gradient, rewrite
from runtime.train.rules._shared import added_at
from runtime.train.rules._windows import volume


@rewrite("MaxPool")
def with_indices(r: Rewriting) -> dict[str, str]:
    if r.attr("storage_order", 0):
        raise TrainingError(f"node {r.node.name} (MaxPool): training needs storage_order 0")
    node = helper.make_node("MaxPool", list(r.node.input),
                            [r.node.output[0], r.node.output[1] if len(r.node.output) > 1
                             and r.node.output[1] else r.e.fresh("argmax")],
                            name=r.node.name)
    node.attribute.extend(r.node.attribute)
    r.e.add(node)
    return {}


@gradient("MaxPool")
def max_pool(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    shape = g.shape(g.x())
    scattered = added_at(g, "ScatterElements", (volume(shape),), g.x(),
                         e.reshape(g.y(1), [-1]), e.reshape(dy, [-1]), axis=0)
    return {0: e.reshape(scattered, shape)}
