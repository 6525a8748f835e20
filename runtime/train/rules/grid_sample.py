"""GridSample (2-D or 3-D; linear, nearest, or 2-D cubic; every padding mode) rewritten
into ai.onnx ops whose rules give its gradient, as PyTorch's grid_sample computes it:
each axis's source coordinate unnormalized from the grid, then its taps. Linear and
nearest pad the coordinate (border: clipped; reflection: reflected, then clipped) and take
the two taps around it weighted by their distance (linear) or the nearest one (nearest,
rounding half to even); cubic takes the four around the unpadded coordinate, weighted by
Keys' cubic (a = -0.75), and pads each tap. Every combination of the axes' taps is read
by GatherElements from the flattened input and weighted by the product of its axes'
weights; a tap outside the input reads as 0. The input's gradient comes back through
GatherElements, the grid's through the weights (none where nearest, or where a clip holds
the coordinate)."""

from __future__ import annotations

import itertools
import math

from onnx import TensorProto, helper

from runtime.errors import TrainingError
from runtime.train.registry import Rewriting, rewrite

_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic",
          "cubic": "cubic"}
Tap = tuple[str, str | None]  # a tap's coordinate along one axis, and its weight


@rewrite("GridSample")
def grid_sample(r: Rewriting) -> dict[str, str]:
    e, (x, grid) = r.e, r.node.input[:2]
    shape, mode = r.shape(x), _MODES.get(r.attr("mode", "bilinear"))
    n, c, *size = shape
    if mode is None or len(size) not in (2, 3) or (mode == "cubic" and len(size) != 2):
        raise TrainingError(f"node {r.node.name} (GridSample): training takes 2-D or 3-D "
                            f"linear or nearest sampling, or 2-D cubic, not {len(size)}-D "
                            f"{r.attr('mode')}")
    out = r.shape(grid)[1:-1]
    flat = e.reshape(x, [n, c, math.prod(size)])
    taps = [_taps(r, e.op("Gather", [grid, e.ints([len(size) - 1 - k])], axis=len(size) + 1),
                  d, mode) for k, d in enumerate(size)]  # (n, *out, 1) coordinates each
    parts = [_read(r, flat, combination, size, (n, c, *out))
             for combination in itertools.product(*taps)]
    e.ops("Sum", parts, [r.node.output[0]])
    return {}


def _taps(r: Rewriting, g: str, size: int, mode: str) -> list[Tap]:
    """One axis's taps, from its normalized grid values."""
    e, x = r.e, r.node.input[0]
    v = _unnormalized(r, g, size)
    if mode != "cubic":
        v = _padded(r, v, size)
        if mode == "nearest":
            return [(e.op("Round", [v]), None)]
        low = e.op("Floor", [v])
        high = e.op("Add", [low, r.const(1, x)])
        return [(low, e.op("Sub", [high, v])), (high, e.op("Sub", [v, low]))]
    low = e.op("Floor", [v])
    t = e.op("Sub", [v, low])
    weights = [_cubic_far(r, e.op("Add", [t, r.const(1, x)])), _cubic_near(r, t),
               _cubic_near(r, e.op("Sub", [r.const(1, x), t])),
               _cubic_far(r, e.op("Sub", [r.const(2, x), t]))]
    return [(_padded(r, e.op("Add", [low, r.const(i - 1, x)]), size), w)
            for i, w in enumerate(weights)]


def _unnormalized(r: Rewriting, g: str, size: int) -> str:
    """align_corners: (g + 1) / 2 * (size - 1); else ((g + 1) * size - 1) / 2."""
    e, x = r.e, r.node.input[0]
    corners = bool(r.attr("align_corners", 0))
    scale = (size - 1) / 2 if corners else size / 2
    return e.op("Add", [e.op("Mul", [g, r.const(scale, x)]),
                        r.const(scale if corners else (size - 1) / 2, x)])


def _padded(r: Rewriting, v: str, size: int) -> str:
    """A coordinate padded: border clipped; reflection reflected off the input's bounds,
    then clipped; zeros as it is (its taps outside read 0)."""
    e, x = r.e, r.node.input[0]
    padding = r.attr("padding_mode", "zeros")
    if padding == "reflection":
        corners = bool(r.attr("align_corners", 0))
        v = _reflected(r, v, *((0.0, size - 1.0) if corners else (-0.5, size - 0.5)))
    if padding in ("border", "reflection"):
        v = e.op("Clip", [v, r.const(0, x), r.const(size - 1, x)])
    return v


def _reflected(r: Rewriting, v: str, low: float, high: float) -> str:
    """`v` reflected into [low, high] (PyTorch's reflect_coordinates)."""
    e, x = r.e, r.node.input[0]
    span = high - low
    if span <= 0:
        return e.op("Mul", [v, r.const(0, x)])
    away = e.op("Abs", [e.op("Sub", [v, r.const(low, x)])])
    flips = e.op("Floor", [e.op("Div", [away, r.const(span, x)])])
    extra = e.op("Sub", [away, e.op("Mul", [flips, r.const(span, x)])])
    even = e.op("Equal", [e.op("Mod", [flips, r.const(2, x)], fmod=1), r.const(0, x)])
    return e.op("Where", [even, e.op("Add", [extra, r.const(low, x)]),
                          e.op("Sub", [r.const(high, x), extra])])


_A = -0.75  # Keys' cubic, as PyTorch and onnxruntime take it


def _cubic_near(r: Rewriting, t: str) -> str:
    """((a + 2) t - (a + 3)) t^2 + 1, for a tap within 1 of the coordinate."""
    e, x = r.e, r.node.input[0]
    inner = e.op("Sub", [e.op("Mul", [t, r.const(_A + 2, x)]), r.const(_A + 3, x)])
    return e.op("Add", [e.op("Mul", [inner, e.op("Mul", [t, t])]), r.const(1, x)])


def _cubic_far(r: Rewriting, t: str) -> str:
    """((a t - 5a) t + 8a) t - 4a, for a tap between 1 and 2 from the coordinate."""
    e, x = r.e, r.node.input[0]
    inner = e.op("Sub", [e.op("Mul", [t, r.const(_A, x)]), r.const(5 * _A, x)])
    inner = e.op("Add", [e.op("Mul", [inner, t]), r.const(8 * _A, x)])
    return e.op("Sub", [e.op("Mul", [inner, t]), r.const(4 * _A, x)])


def _read(r: Rewriting, flat: str, combination: tuple[Tap, ...], size: list[int],
          shape: tuple[int, ...]) -> str:
    """The input at one combination of the axes' taps for every output position, times
    its weight, 0 where a tap falls outside the input: (n, c, *out)."""
    e, x = r.e, r.node.input[0]
    inside, index, weight = None, None, None
    stride = math.prod(size)
    for (at, w), limit in zip(combination, size, strict=True):
        within = e.op("And", [e.op("GreaterOrEqual", [at, r.const(0, x)]),
                              e.op("LessOrEqual", [at, r.const(limit - 1, x)])])
        inside = within if inside is None else e.op("And", [inside, within])
        stride //= limit
        term = e.op("Mul", [e.op("Clip", [at, r.const(0, x), r.const(limit - 1, x)]),
                            r.const(stride, x)])
        index = term if index is None else e.op("Add", [index, term])
        if w is not None:
            weight = w if weight is None else e.op("Mul", [weight, w])
    assert inside is not None and index is not None
    n, c, *out = shape
    cells = math.prod(out)
    index = e.op("Cast", [index], to=TensorProto.INT64)
    index = e.expand(e.reshape(index, [n, 1, cells]), [n, c, cells])
    taken = e.reshape(e.op("GatherElements", [flat, index], axis=2), list(shape))
    mask = e.op("Cast", [inside], to=helper.np_dtype_to_tensor_dtype(r.facts.dtype(x)))
    scale = mask if weight is None else e.op("Mul", [weight, mask])
    return e.op("Mul", [taken, e.reshape(scale, [n, 1, *out])])
