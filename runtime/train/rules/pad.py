"""Pad (constant mode): the input's gradient is the output's with the padding cut off (and
zeros put back where a negative pad cropped the input); the pad value's is the sum over
the padding."""

from __future__ import annotations

from runtime.errors import TrainingError
from runtime.train.registry import Grad, gradient


@gradient("Pad")
def pad(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    if g.attr("mode", "constant") != "constant":
        raise TrainingError(f"node {g.node.name} (Pad): only constant padding trains")
    shape = g.shape(g.x())
    rank = len(shape)
    pads = [int(p) for p in g.static(1, "pads").reshape(-1)]
    axes = [int(a) % rank for a in g.static(3, "axes").reshape(-1)] if g.has(3) \
        else list(range(rank))
    begin, end = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        begin[axis], end[axis] = pads[i], pads[len(axes) + i]
    starts = [max(b, 0) for b in begin]
    kept = [d + min(b, 0) + min(a, 0) for d, b, a in zip(shape, begin, end, strict=True)]
    cut = e.op("Slice", [dy, e.ints(starts), e.ints([s + k for s, k in zip(starts, kept,
                                                                          strict=True)]),
                         e.ints(list(range(rank)))])
    cropped = [-min(b, 0) for b in begin] + [-min(a, 0) for a in end]
    grads = {0: e.op("Pad", [cut, e.ints(cropped)]) if any(cropped) else cut}
    if g.has(2) and g.needs(2):  # the pad value: every padded position's gradient
        every = list(range(rank))
        padded = e.op("Sub", [e.sum(dy, every, keepdims=False), e.sum(cut, every,
                                                                     keepdims=False)])
        grads[2] = e.reshape(padded, g.shape(g.x(2)))
    return grads
