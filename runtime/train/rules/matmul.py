"""MatMul with numpy's rules: a 1-D operand is a row (a) or a column (b) dropped from the
result; batch dimensions broadcast. da = dy @ b^T and db = a^T @ dy, each summed over the
batch dimensions it was broadcast on."""

from __future__ import annotations

from runtime.train.emit import Shape, broadcast_shape
from runtime.train.registry import Grad, gradient


def _swap_last(rank: int) -> list[int]:
    return [*range(rank - 2), rank - 1, rank - 2]


@gradient("MatMul")
def matmul(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    a, b = g.x(0), g.x(1)
    a_shape, b_shape = g.shape(a), g.shape(b)
    a2: Shape = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2: Shape = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    out2 = (*broadcast_shape(a2[:-2], b2[:-2]), a2[-2], b2[-1])
    dy2 = e.reshape(dy, out2) if out2 != g.shape(g.y()) else dy
    a_in = e.reshape(a, a2) if a2 != a_shape else a
    b_in = e.reshape(b, b2) if b2 != b_shape else b
    grads = {}
    if g.needs(0):
        da = e.op("MatMul", [dy2, e.transpose(b_in, _swap_last(len(b2)))])
        grads[0] = e.unbroadcast(da, (*out2[:-2], a2[-2], a2[-1]), a2)
        if a2 != a_shape:
            grads[0] = e.reshape(grads[0], a_shape)
    if g.needs(1):
        db = e.op("MatMul", [e.transpose(a_in, _swap_last(len(a2))), dy2])
        grads[1] = e.unbroadcast(db, (*out2[:-2], b2[-2], b2[-1]), b2)
        if b2 != b_shape:
            grads[1] = e.reshape(grads[1], b_shape)
    return grads
