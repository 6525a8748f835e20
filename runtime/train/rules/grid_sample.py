"""GridSample (2-D, linear or nearest, every padding mode) rewritten into ai.onnx ops whose
rules give its gradient, as PyTorch's grid_sample computes it: each output position's
source coordinate, unnormalized from the grid and padded (border: clipped; reflection:
reflected, then clipped), then the four corners around it weighted by their distance
(linear) or the nearest one (nearest, rounding half to even), each read by GatherElements
from the flattened input; a corner outside the input reads as 0. The input's gradient
comes back through GatherElements, the grid's through the corner weights (none where
nearest, or where a clip holds the coordinate)."""

from __future__ import annotations

from onnx import TensorProto, helper

from runtime.errors import TrainingError
from runtime.train.registry import Rewriting, rewrite

_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest"}


@rewrite("GridSample")
def grid_sample(r: Rewriting) -> dict[str, str]:
    e, (x, grid) = r.e, r.node.input[:2]
    shape, mode = r.shape(x), _MODES.get(r.attr("mode", "bilinear"))
    if mode is None or len(shape) != 4:
        raise TrainingError(f"node {r.node.name} (GridSample): training takes 2-D linear or "
                            f"nearest sampling, not {len(shape) - 2}-D {r.attr('mode')}")
    n, c, height, width = shape
    out = r.shape(grid)[1:3]
    flat = e.reshape(x, [n, c, height * width])
    coords = [_source(r, e.op("Gather", [grid, e.ints([axis])], axis=3), size)
              for axis, size in ((0, width), (1, height))]  # (n, h_out, w_out, 1) each
    corners: list[tuple[list[str], str | None]]
    if mode == "nearest":
        corners = [([e.op("Round", [v]) for v in coords], None)]
    else:
        low = [e.op("Floor", [v]) for v in coords]
        high = [e.op("Add", [v, r.const(1, x)]) for v in low]
        far = [e.op("Sub", [v, lo]) for v, lo in zip(coords, low, strict=True)]  # to low
        near = [e.op("Sub", [hi, v]) for v, hi in zip(coords, high, strict=True)]
        corners = [([cx, cy], e.op("Mul", [wx, wy]))
                   for cx, wx in ((low[0], near[0]), (high[0], far[0]))
                   for cy, wy in ((low[1], near[1]), (high[1], far[1]))]
    parts = [_corner(r, flat, position, weight, (width, height), (n, c, *out))
             for position, weight in corners]
    e.ops("Sum", parts, [r.node.output[0]])
    return {}


def _source(r: Rewriting, g: str, size: int) -> str:
    """One axis's source coordinate from its normalized grid value, padded."""
    e, x = r.e, r.node.input[0]
    corners = bool(r.attr("align_corners", 0))
    # align_corners: (g + 1) / 2 * (size - 1); else ((g + 1) * size - 1) / 2
    scale = (size - 1) / 2 if corners else size / 2
    v = e.op("Add", [e.op("Mul", [g, r.const(scale, x)]), r.const(scale if corners else
                                                                   (size - 1) / 2, x)])
    padding = r.attr("padding_mode", "zeros")
    if padding == "reflection":
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


def _corner(r: Rewriting, flat: str, position: list[str], weight: str | None,
            size: tuple[int, int], shape: tuple[int, ...]) -> str:
    """The input at one corner (x, y) of every output position, times its weight, 0 where
    the corner falls outside the input: (n, c, h_out, w_out)."""
    e, x = r.e, r.node.input[0]
    (px, py), (width, height) = position, size
    inside = None
    for v, limit in ((px, width), (py, height)):
        within = e.op("And", [e.op("GreaterOrEqual", [v, r.const(0, x)]),
                              e.op("LessOrEqual", [v, r.const(limit - 1, x)])])
        inside = within if inside is None else e.op("And", [inside, within])
    assert inside is not None
    clipped = [e.op("Clip", [v, r.const(0, x), r.const(limit - 1, x)])
               for v, limit in ((px, width), (py, height))]
    index = e.op("Cast", [e.op("Add", [e.op("Mul", [clipped[1], r.const(width, x)]),
                                       clipped[0]])], to=TensorProto.INT64)
    n, c, h_out, w_out = shape
    index = e.expand(e.reshape(index, [n, 1, h_out * w_out]), [n, c, h_out * w_out])
    taken = e.reshape(e.op("GatherElements", [flat, index], axis=2), list(shape))
    mask = e.op("Cast", [inside], to=helper.np_dtype_to_tensor_dtype(r.facts.dtype(x)))
    scale = mask if weight is None else e.op("Mul", [weight, mask])
    return e.op("Mul", [taken, e.reshape(scale, [n, 1, h_out, w_out])])
