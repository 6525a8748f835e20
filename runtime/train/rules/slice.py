"""Slice: the output's gradient put back where the slice took it from, zeros elsewhere.
Starts, ends, axes and steps must not depend on the data. Unit steps pad; other steps
scatter into a flat zero tensor at the (unique) positions taken, found by slicing an
index array with numpy, whose clamping is ONNX's."""

from __future__ import annotations

import math

import numpy as np

from runtime.train.registry import Grad, gradient
from runtime.train.rules._shared import zeros


def _slices(g: Grad) -> tuple[slice, ...]:
    shape = g.shape(g.x())
    starts = g.static(1, "starts").reshape(-1)
    ends = g.static(2, "ends").reshape(-1)
    axes = g.static(3, "axes").reshape(-1) if g.has(3) else np.arange(len(starts))
    steps = g.static(4, "steps").reshape(-1) if g.has(4) else np.ones(len(starts), np.int64)
    out = [slice(None)] * len(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        out[int(axis) % len(shape)] = slice(int(start), int(end), int(step))
    return tuple(out)


@gradient("Slice")
def slice_(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    shape = g.shape(g.x())
    cuts = _slices(g)
    ranges = [range(*s.indices(d)) for s, d in zip(cuts, shape, strict=True)]
    if all(r.step == 1 for r in ranges):
        before = [r.start for r in ranges]
        after = [d - r.start - len(r) for r, d in zip(ranges, shape, strict=True)]
        return {0: e.op("Pad", [dy, e.ints(before + after)])}
    taken = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)[cuts].reshape(-1)
    flat = e.op("ScatterElements", [zeros(g, (math.prod(shape),), g.x()),
                                    e.ints(taken.tolist()), e.reshape(dy, [-1])], axis=0)
    return {0: e.reshape(flat, shape)}
