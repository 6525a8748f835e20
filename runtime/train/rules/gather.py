"""Gather: the output's gradient added back into a zero tensor at the gathered positions
(repeated indices add up): the axis moved to the front, ScatterND with reduction add,
moved back. Negative indices count from the end there as well."""

from __future__ import annotations

from onnx import TensorProto

from runtime.train.emit import permutation_inverse
from runtime.train.registry import Grad, gradient
from runtime.train.rules._shared import added_at


@gradient("Gather")
def gather(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    data, indices = g.x(0), g.x(1)
    shape, idx_rank = g.shape(data), len(g.shape(indices))
    axis = g.attr("axis", 0) % len(shape)
    index = e.op("Cast", [indices], to=TensorProto.INT64)
    # dy: data[:axis] + indices + data[axis+1:] -> indices + data[:axis] + data[axis+1:]
    rank = len(shape) - 1 + idx_rank
    front = [*range(axis, axis + idx_rank), *range(axis), *range(axis + idx_rank, rank)]
    moved = e.transpose(dy, front)
    base = (shape[axis], *shape[:axis], *shape[axis + 1:])
    scattered = added_at(g, "ScatterND", base, data, e.unsqueeze(index, [-1]), moved)
    back = permutation_inverse([axis, *range(axis), *range(axis + 1, len(shape))])
    return {0: e.transpose(scattered, back)}
