"""Transpose: the gradient goes back through the inverse permutation."""

from runtime.train.emit import permutation_inverse
from runtime.train.registry import Grad, gradient


@gradient("Transpose")
def transpose(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    rank = len(g.shape(g.x()))
    perm = g.attr("perm") or list(reversed(range(rank)))
    return {0: g.e.transpose(dy, permutation_inverse(perm))}
