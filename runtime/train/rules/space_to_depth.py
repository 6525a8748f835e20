"""SpaceToDepth (`_rearrange`)."""

from runtime.train.registry import Grad, gradient
from runtime.train.rules._rearrange import moved_back


@gradient("SpaceToDepth")
def space_to_depth(g: Grad) -> dict[int, str]:
    n, c, h, w = g.shape(g.x())
    b = g.attr("blocksize")
    return moved_back(g, [n, c, h // b, b, w // b, b], [0, 3, 5, 1, 2, 4])
