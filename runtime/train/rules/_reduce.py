"""The axes a Reduce* node reduces over, wherever its opset keeps them (an attribute, or
an input that must not depend on the data), and its gradient spread back over them."""

from __future__ import annotations

from runtime.train.registry import Grad


def reduced_axes(g: Grad) -> list[int]:
    rank = len(g.shape(g.x()))
    if g.has(1):
        axes = [int(a) for a in g.static(1, "axes").reshape(-1)]
    else:
        axes = list(g.attr("axes", []) or [])
    if not axes:
        return [] if g.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted(a % rank for a in axes)


def spread_back(g: Grad, axes: list[int]) -> str:
    """The output's gradient, as the input's shape: reshaped to keep the reduced axes
    (as size 1), then expanded over them."""
    dy = g.dy()
    assert dy is not None
    shape = g.shape(g.x())
    kept = [1 if i in axes else d for i, d in enumerate(shape)]
    return g.e.expand(g.e.reshape(dy, kept), shape)
