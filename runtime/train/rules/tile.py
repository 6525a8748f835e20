"""Tile: each copy's gradient adds up: dy reshaped to (repeats_0, d_0, repeats_1, d_1,
...) and summed over the repeats."""

from runtime.train.registry import Grad, gradient


@gradient("Tile")
def tile(g: Grad) -> dict[int, str]:
    dy = g.dy()
    assert dy is not None
    shape = g.shape(g.x())
    repeats = [int(r) for r in g.static(1, "repeats").reshape(-1)]
    split = [n for r, d in zip(repeats, shape, strict=True) for n in (r, d)]
    summed = g.e.sum(g.e.reshape(dy, split), list(range(0, 2 * len(shape), 2)), keepdims=False)
    return {0: summed}
