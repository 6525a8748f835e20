"""DepthToSpace, DCR or CRD (`_rearrange`)."""

from runtime.train.registry import Grad, gradient
from runtime.train.rules._rearrange import moved_back


@gradient("DepthToSpace")
def depth_to_space(g: Grad) -> dict[int, str]:
    n, c, h, w = g.shape(g.x())
    b = g.attr("blocksize")
    if g.attr("mode", "DCR") == "CRD":
        return moved_back(g, [n, c // (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3])
    return moved_back(g, [n, b, b, c // (b * b), h, w], [0, 3, 4, 1, 5, 2])
