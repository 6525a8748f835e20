"""DepthToSpace and SpaceToDepth move elements only: each is a reshape, a transpose and
a reshape, so its gradient is dy put through them backwards."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.train.emit import permutation_inverse
from runtime.train.registry import Grad


def moved_back(g: Grad, split: Sequence[int], perm: Sequence[int]) -> dict[int, str]:
    """The gradient of reshape(transpose(reshape(x, `split`), `perm`), y's shape)."""
    dy, e = g.dy(), g.e
    assert dy is not None
    moved = e.reshape(dy, [split[p] for p in perm])
    return {0: e.reshape(e.transpose(moved, permutation_inverse(perm)), g.shape(g.x()))}
