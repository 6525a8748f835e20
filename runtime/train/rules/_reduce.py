"""The axes a Reduce* node reduces over, wherever its opset keeps them (an attribute, or
an input that must not depend on the data), and its gradient spread back over them."""

from __future__ import annotations

from onnx import helper

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


def kept(g: Grad, t: str, axes: list[int]) -> str:
    """`t`, shaped as the output with the reduced axes kept (size 1): it broadcasts
    against the input."""
    shape = g.shape(g.x())
    return g.e.reshape(t, [1 if i in axes else d for i, d in enumerate(shape)])


def spread_back(g: Grad, axes: list[int]) -> str:
    """The output's gradient, as the input's shape: `kept`, then expanded over them."""
    dy = g.dy()
    assert dy is not None
    return g.e.expand(kept(g, dy, axes), g.shape(g.x()))


def to_reduced_extremes(g: Grad, axes: list[int] | None = None) -> dict[int, str]:
    """ReduceMax and ReduceMin (over `axes`, else the node's): the gradient goes to the
    elements equal to the result, split evenly among ties (as PyTorch's amax and amin)."""
    axes, e = reduced_axes(g) if axes is None else axes, g.e
    elem = helper.np_dtype_to_tensor_dtype(g.facts.dtype(g.x()))
    hit = e.op("Cast", [e.op("Equal", [g.x(), kept(g, g.y(), axes)])], to=elem)
    share = e.op("Div", [spread_back(g, axes), e.sum(hit, axes, keepdims=True)])
    return {0: e.op("Mul", [share, hit])}
