"""AveragePool: each output's gradient, over its divisor, spread evenly over its window:
a depthwise ConvTranspose with a kernel of ones, windows cut to the padded input. The
divisor is each window's tap count, counted once per spatial axis at build time (inside
the input, or inside the padded input with count_include_pad)."""

from __future__ import annotations

import math

import numpy as np

from runtime.train.registry import Grad, gradient
from runtime.train.rules._windows import Windows, kernel_of


@gradient("AveragePool")
def average_pool(g: Grad) -> dict[int, str]:
    dy, x, e = g.dy(), g.x(), g.e
    assert dy is not None
    win = Windows.of(g, kernel_of(g)).within()
    channels = g.shape(x)[1]
    counts = win.taps(bool(g.attr("count_include_pad", 0)))
    divisor = math.prod(np.ix_(*[np.asarray(c) for c in counts])) if counts else 1
    dtype = g.facts.dtype(x)
    share = e.op("Div", [dy, e.const(np.maximum(divisor, 1), dtype)])
    ones = e.const(np.ones((channels, 1, *win.kernel), dtype), dtype)
    return {0: e.op("ConvTranspose", [share, ones], group=channels, **win.spread())}
