"""Split: the input's gradient is its outputs' gradients put back together along the
axis (zeros for an output nothing reads)."""

from __future__ import annotations

from runtime.train.registry import Grad, gradient
from runtime.train.rules._shared import zeros


@gradient("Split")
def split(g: Grad) -> dict[int, str]:
    rank = len(g.shape(g.x()))
    axis = g.attr("axis", 0) % rank
    parts = [g.dy(i) or zeros(g, g.shape(y), g.x()) for i, y in enumerate(g.node.output)]
    return {0: g.e.op("Concat", parts, axis=axis)}
