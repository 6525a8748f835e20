"""The sizes made-up inputs give a model's free (symbolic) dimensions where nobody said one
(`--bind`): 1, one sample or one token, except an image's height and width. At 1x1 most
vision networks fail: a detector's upsampled features no longer line up with the ones it
joins them to, a convolution's kernel outgrows its input. Those take the side such networks
are trained at, 224: ImageNet's, and a multiple of the strides and patches they divide it
by (32, 16, 14)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

IMAGE_SIDE = 224
_CHANNELS = (1, 3, 4)  # grey, RGB, RGBA

Dims = Sequence[int | str | None]


def image_axes(dims: Dims | None, floating: bool) -> tuple[int, ...]:
    """The free ones of an image input's height and width axes: a float tensor of rank 4
    whose channels (1, 3 or 4) come first (NCHW) or last (NHWC), a side free (a text
    line's width, its height fixed: PP-OCR's recognizer reads [N, 3, 48, W], and at a
    width of 1 it reads nothing)."""
    if not floating or dims is None or len(dims) != 4:
        return ()
    for channels, sides in ((1, (2, 3)), (3, (1, 2))):
        free = tuple(a for a in sides if not isinstance(dims[a], int))
        if dims[channels] in _CHANNELS and free:
            return free
    return ()


def free_sizes(inputs: Iterable[tuple[Dims | None, bool]], bindings: Mapping[str, int]
               ) -> dict[str, int]:
    """Named free dimensions' sizes for inputs given as (dims, floating): `bindings`, and
    the image side for a name an image input has as its height or width, so every input
    naming it agrees."""
    sides = {str(dims[a]): IMAGE_SIDE for dims, floating in inputs
             for a in image_axes(dims, floating) if dims is not None and dims[a]}
    return {**sides, **bindings}


def made_up_shape(dims: Dims, floating: bool, sizes: Mapping[str, int], default: int = 1
                  ) -> tuple[int, ...]:
    """One input's shape: fixed sizes as they are, named ones from `sizes` (`free_sizes`),
    an unnamed image side as IMAGE_SIDE, any other `default`."""
    sides = image_axes(dims, floating)
    return tuple(d if isinstance(d, int) else int(sizes[d]) if d is not None and d in sizes
                 else IMAGE_SIDE if a in sides else default for a, d in enumerate(dims))
