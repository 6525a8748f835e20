"""ConvTranspose: the adjoint of the Conv, by the same weights, from its output's space
back to its input's. So dX is that Conv of dY (same strides, dilations, pads, groups: it
comes out X's size, as output padding stays below the stride), and dW is that Conv's
weight gradient, its input dY and its output's gradient X. Pads are the attributes', or,
given `output_shape` or SAME padding, onnx's spec's, as onnxruntime computes them (none
where the output is larger than the windows reach). dB sums dY over batch and space.
"""

from __future__ import annotations

from runtime.train.registry import Grad, gradient
from runtime.train.rules._windows import Windows
from runtime.train.rules.conv import convolution


@gradient("ConvTranspose")
def conv_transpose(g: Grad) -> dict[int, str]:
    win = _adjoint(g, tuple(g.shape(g.x(1))[2:]))

    def input_gradient(dy: str, w: str, group: int) -> str:
        return g.e.op("Conv", [dy, w], group=group, strides=list(win.strides),
                      dilations=list(win.dilations), pads=[*win.begin, *win.end])

    return convolution(g, win, input_gradient, adjoint=True)


def _adjoint(g: Grad, kernel: tuple[int, ...]) -> Windows:
    """The geometry of the Conv from Y's space (`spatial`) to X's (`out`)."""
    ins, outs = tuple(g.shape(g.x())[2:]), tuple(g.shape(g.y())[2:])
    n = len(ins)
    strides = tuple(g.attr("strides") or [1] * n)
    dilations = tuple(g.attr("dilations") or [1] * n)
    auto = g.attr("auto_pad", "NOTSET")
    if auto == "NOTSET" and not g.attr("output_shape"):
        pads = g.attr("pads") or [0] * 2 * n
        return Windows(outs, ins, kernel, strides, dilations, tuple(pads[:n]), tuple(pads[n:]))
    if auto == "VALID":
        return Windows(outs, ins, kernel, strides, dilations, (0,) * n, (0,) * n)
    extra = g.attr("output_padding") or [0] * n
    begin, end = [], []
    for i, o, k, s, d, p in zip(ins, outs, kernel, strides, dilations, extra, strict=True):
        total = max(0, s * (i - 1) + p + (k - 1) * d + 1 - o)
        half = total // 2
        begin.append(half if auto == "SAME_UPPER" else total - half)
        end.append(total - begin[-1])
    return Windows(outs, ins, kernel, strides, dilations, tuple(begin), tuple(end))
