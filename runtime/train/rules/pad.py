"""Pad. Constant mode: the input's gradient is the output's with the padding cut off (and
zeros put back where a negative pad cropped the input); the pad value's is the sum over
the padding. Reflect, edge and wrap are rewritten as one Gather per padded axis, by the
input position each output position takes, whose rule adds the gradient back."""

from __future__ import annotations

import numpy as np

from runtime.train.registry import Grad, Rewriting, gradient, rewrite


def begin_end(view: Grad | Rewriting) -> tuple[list[int], list[int]]:
    """Each axis's pads at its beginning and end (axes not named: none)."""
    node, rank = view.node, len(view.shape(view.node.input[0]))
    pads = [int(p) for p in view.facts.constant(node.input[1], node, "pads").reshape(-1)]
    axes = [int(a) % rank for a in view.facts.constant(node.input[3], node, "axes").reshape(-1)] \
        if len(node.input) > 3 and node.input[3] else list(range(rank))
    begin, end = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        begin[axis], end[axis] = pads[i], pads[len(axes) + i]
    return begin, end


def positions(mode: str, size: int, begin: int, end: int) -> np.ndarray:
    """The input position each output position of one axis takes."""
    at = np.arange(-begin, size + end)
    if mode == "edge":
        return np.clip(at, 0, size - 1)
    if mode == "wrap":
        return at % size
    period = max(2 * (size - 1), 1)  # reflect: the edge itself not repeated
    at %= period
    return np.where(at < size, at, period - at)


@rewrite("Pad")
def gathered(r: Rewriting) -> dict[str, str]:
    mode, e, x = r.attr("mode", "constant"), r.e, r.node.input[0]
    if mode == "constant":
        e.add(r.node)
        return {}
    begin, end = begin_end(r)
    shape = r.shape(x)
    padded = [a for a in range(len(shape)) if begin[a] or end[a]]
    for axis in padded:
        last = axis == padded[-1]
        x = e.ops("Gather", [x, e.ints(positions(mode, shape[axis], begin[axis],
                                                 end[axis]).tolist())],
                  [r.node.output[0]] if last else 1, axis=axis)[0]
    if not padded:
        e.ops("Identity", [x], [r.node.output[0]])
    return {}


@gradient("Pad")
def pad(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    shape = g.shape(g.x())
    rank = len(shape)
    begin, end = begin_end(g)
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
