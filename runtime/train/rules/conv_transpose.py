"""ConvTranspose: the adjoint of the Conv, by the same weights, from its output's space
back to its input's. So dX is that Conv of dY (same strides, dilations, pads, groups: it
comes out X's size, as output padding stays below the stride), and dW is that Conv's
weight gradient, its input dY and its output's gradient X (`Windows.of(..., adjoint=True)`
gives that Conv's pads). dB sums dY over batch and space.
"""

from __future__ import annotations

from runtime.train.registry import Grad, gradient
from runtime.train.rules._windows import Windows
from runtime.train.rules.conv import convolution


@gradient("ConvTranspose")
def conv_transpose(g: Grad) -> dict[int, str]:
    win = Windows.of(g, tuple(g.shape(g.x(1))[2:]), adjoint=True)

    def input_gradient(dy: str, w: str, group: int) -> str:
        return g.e.op("Conv", [dy, w], group=group, strides=list(win.strides),
                      dilations=list(win.dilations), pads=[*win.begin, *win.end])

    return convolution(g, win, input_gradient, adjoint=True)
