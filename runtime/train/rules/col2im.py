"""Col2Im (PyTorch's fold): dX is Im2Col of dY (PyTorch's unfold), a Conv by a one-hot
kernel per (channel, block position), in Col2Im's order: channel-major, then the block
row-major."""

from __future__ import annotations

import math

import numpy as np

from runtime.train.registry import Grad, gradient


@gradient("Col2Im")
def col2im(g: Grad) -> dict[int, str]:
    dy, e = g.dy(), g.e
    assert dy is not None
    block = [int(b) for b in g.static(2, "block_shape").reshape(-1)]
    n, columns, _ = g.shape(g.x())
    per_block = math.prod(block)
    picks = np.eye(columns).reshape(columns, columns // per_block, *block)
    rank = len(block)
    patches = e.op("Conv", [dy, g.const(picks, g.x())],
                   strides=g.attr("strides") or [1] * rank,
                   dilations=g.attr("dilations") or [1] * rank,
                   pads=g.attr("pads") or [0] * 2 * rank)
    return {0: e.reshape(patches, [n, columns, -1])}
