"""Conv (any spatial rank, groups, strides, dilations, pads or auto_pad).

dX is a ConvTranspose of dY by the same weights and groups. dW is itself a convolution:
of X with batch and channels swapped, by dY as the kernel, strides and dilations
exchanged, cut to the kernel's size; groups ride along by folding each group's channels
next to the batch.
dB sums dY over batch and space.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.train.emit import Shape
from runtime.train.registry import Grad, gradient
from runtime.train.rules._windows import Windows


@gradient("Conv")
def conv(g: Grad) -> dict[int, str]:
    win = Windows.of(g, tuple(g.shape(g.x(1))[2:]))
    return convolution(g, win, lambda dy, w, group: g.e.op("ConvTranspose", [dy, w], group=group,
                                                           **win.spread()))


def convolution(g: Grad, win: Windows, input_gradient: Callable[[str, str, int], str],
                adjoint: bool = False) -> dict[int, str]:
    """A Conv's gradients, or (`adjoint`) a ConvTranspose's, the adjoint of the Conv `win`
    describes: dX by `input_gradient(dY, W, group)`; dW the Conv's weight gradient (of
    the ConvTranspose's Conv: its input dY, its output's gradient X); dB dY summed."""
    dy = g.dy()
    assert dy is not None
    x, w_shape, group = g.x(0), g.shape(g.x(1)), int(g.attr("group", 1))
    grads = {}
    if g.needs(0):
        grads[0] = input_gradient(dy, g.x(1), group)
    if g.needs(1):
        grads[1] = _weight_gradient(g, *((dy, x) if adjoint else (x, dy)), w_shape, group, win)
    if g.has(2) and g.needs(2):
        grads[2] = g.e.sum(dy, [0, *range(2, len(g.shape(g.y())))], keepdims=False)
    return grads


def _weight_gradient(g: Grad, x: str, dy: str, w_shape: Shape, group: int, win: Windows
                    ) -> str:
    """dW of a convolution of `x` by weights of `w_shape` whose output's gradient is `dy`,
    `win` its geometry (x's size `spatial`, dy's `out`)."""
    e, n, kernel = g.e, g.shape(g.x())[0], tuple(w_shape[2:])
    rank = len(kernel)
    cin, cout = w_shape[1], w_shape[0] // group  # per group
    spatial = list(range(3, 3 + rank))
    # X (N, G*cin, S) -> (cin, G*N, S): group j's channel c of sample i at [c, j*N + i]
    xt = e.reshape(e.transpose(e.reshape(x, [n, group, cin, *win.spatial]),
                               [2, 1, 0, *spatial]), [cin, group * n, *win.spatial])
    # dY (N, G*cout, O) -> (G*cout, N, O)
    dyt = e.reshape(e.transpose(e.reshape(dy, [n, group, cout, *win.out]),
                                [1, 2, 0, *spatial]), [group * cout, n, *win.out])
    full = e.op("Conv", [xt, dyt], group=group, strides=list(win.dilations),
                dilations=list(win.strides), pads=[*win.begin, *win.end])
    cut = e.op("Slice", [full, e.ints([0] * rank), e.ints(list(kernel)),
                         e.ints(list(range(2, 2 + rank)))])
    return e.transpose(cut, [1, 0, *range(2, 2 + rank)])
