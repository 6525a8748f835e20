"""The `reference` backend's own kernels, where onnx's evaluator computes other values
than onnx's spec (and onnxruntime) do.

- ConvTranspose of more than one group: the evaluator adds bias[0] alone, and fails on
  groups wider than one channel; and one whose `output_shape` cuts the output by a stride
  or more, where it fails.
- LRN: the evaluator loops over the batch axis where the channels are meant, leaving
  the channels past the batch size unnormalized.
- GridSample: the evaluator fails on opset 16's mode names (bilinear, bicubic), clips a
  cubic coordinate under border padding where onnxruntime and PyTorch clip each tap, and
  samples one output value at a time in Python (seconds for a small image).
- GatherElements: the evaluator fails on an axis longer than 64 (np.choose's limit), or
  indices smaller than the data off the axis.
- MaxPool, AveragePool and LpPool: the evaluator sizes ceil_mode and SAME_LOWER windows
  otherwise (GoogLeNet's stride-1 `ceil_mode` MaxPool grows by 2), and counts LpPool's
  ceil_mode windows wrong. Here every window is a strided view of the padded input.
- GlobalMaxPool: the evaluator reduces the channels too where the input is not 4-d
  (Keras' GlobalMaxPooling1D through tf2onnx).
- BatchNormalization at opsets 9 to 13: the evaluator normalizes by the batch's own
  statistics, since the schema's default momentum is always set (Keras' ResNet50V2 at
  opset 13 through tf2onnx: 0.2 off); as at opset 14, the statistics given, unless
  `training_mode`.
- Loop: the evaluator joins its scan outputs along their first axis (and turns scalars
  into a column) where onnxruntime and onnx's shape inference stack them on a new one
  (tf2onnx's SimpleRNN, a GRU with reset_after=False, an LSTM after Masking).
- Resize: TensorFlow's nearest-neighbour sampling (`tf_half_pixel_for_nn`, which tf2onnx
  writes for UpSampling2D and onnxruntime runs), a mode the evaluator does not know.
- Upsample (opsets 7 to 9): the evaluator repeats by whole nearest scales only, and fails
  on `linear` (torchvision's LR-ASPP exported at opset 9).
- DequantizeLinear below opset 19: the evaluator (onnx 1.23) keeps kernels from 19 on
  only, so a QOperator or QDQ model at opsets 10 to 18 (onnxruntime's quantizer writes
  13) failed to load on the reference device.
- ai.onnx.ml's ZipMap, which the evaluator lacks: every classifier skl2onnx, onnxmltools
  (LightGBM, XGBoost) and CatBoost export ends in one unless told not to.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_batch_normalization import BatchNormalization_14
from onnx.reference.ops.op_conv_transpose import ConvTranspose as _ConvTranspose
from onnx.reference.ops.op_dequantize_linear import _CommonDequantizeLinear
from onnx.reference.ops.op_loop import Loop as _Loop
from onnx.reference.ops.op_resize import Resize as _Resize


class ConvTranspose(_ConvTranspose):
    """Groups one at a time; an `output_shape` cut from the whole output (or the whole
    output padded at its end), as the spec pads it, before the bias."""

    def _run(self, X, W, B=None, group=None, output_shape=None, **attrs):  # type: ignore[override]
        if output_shape:
            auto_pad = attrs.get("auto_pad")
            attrs.update(auto_pad="NOTSET", pads=None)
            y = _fitted(self._run(X, W, None, group=group, **attrs)[0], output_shape, auto_pad)
            return (y if B is None else y + B.reshape(-1, *[1] * (y.ndim - 2)),)
        if not group or group == 1:
            return super()._run(X, W, B, group=group, **attrs)
        biases = np.split(B, group) if B is not None else [None] * group
        parts = [super(ConvTranspose, self)._run(x, w, b, group=1, **attrs)[0] for x, w, b in
                 zip(np.split(X, group, axis=1), np.split(W, group), biases, strict=True)]
        return (np.concatenate(parts, axis=1),)


def same_pads(total: int, auto_pad: str) -> tuple[int, int]:
    """SAME's `total` padding of one axis split into (begin, end): the odd one at the
    end for SAME_UPPER, at the beginning for SAME_LOWER."""
    begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
    return begin, total - begin


def _fitted(whole: np.ndarray, shape: list[int], auto_pad: str | None) -> np.ndarray:
    """`whole` cut to spatial `shape` as SAME splits the excess (SAME_LOWER unless told),
    or padded with zeros at the end where `shape` is larger."""
    cut, grown = [slice(None), slice(None)], [(0, 0), (0, 0)]
    for size, want in zip(whole.shape[2:], shape, strict=True):
        begin = same_pads(size - want, auto_pad or "SAME_LOWER")[0] if size > want else 0
        cut.append(slice(begin, begin + want))
        grown.append((0, max(0, want - size)))
    return np.pad(whole[tuple(cut)], grown)


@dataclass(frozen=True)
class PoolWindows:
    """A pooling node's windows over its input's spatial axes, sized as onnx's spec does."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]  # pads
    end: tuple[int, ...]
    out: tuple[int, ...]  # windows per axis

    @classmethod
    def of(cls, spatial: tuple[int, ...], attrs: dict) -> PoolWindows:
        n = len(spatial)
        kernel = tuple(attrs["kernel_shape"])
        strides = tuple(attrs.get("strides") or [1] * n)
        dilations = tuple(attrs.get("dilations") or [1] * n)
        auto_pad = attrs.get("auto_pad") or "NOTSET"
        pads = attrs.get("pads") or [0] * 2 * n
        begin, end, out = [], [], []
        for i, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations,
                                                strict=True)):
            reach = (k - 1) * d + 1
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                o = -(-size // s)
                b, e = same_pads(max(0, (o - 1) * s + reach - size), auto_pad)
            elif auto_pad == "VALID":
                b, e, o = 0, 0, (size - reach) // s + 1
            else:
                b, e = pads[i], pads[i + n]
                room = size + b + e - reach
                o = (-(-room // s) if attrs.get("ceil_mode") else room // s) + 1
                if attrs.get("ceil_mode") and (o - 1) * s >= size + b:
                    o -= 1  # a last window starting in the end padding is dropped
            begin.append(b)
            end.append(e)
            out.append(max(o, 0))
        return cls(kernel, strides, dilations, tuple(begin), tuple(end), tuple(out))

    def view(self, x: np.ndarray, fill: float | int) -> np.ndarray:
        """Every window of `x` padded with `fill`: shape (N, C, *out, *kernel), a view."""
        if 0 in self.out:
            return np.empty(x.shape[:2] + self.out + self.kernel, x.dtype)
        reach = [(k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations, strict=True)]
        last = [(o - 1) * s + r for o, s, r in zip(self.out, self.strides, reach, strict=True)]
        widths = [(0, 0)] * (x.ndim - len(reach)) + [
            (b, max(0, n - b - size)) for b, n, size in zip(self.begin, last, x.shape[2:],
                                                            strict=True)]
        padded = np.pad(x, widths, constant_values=fill)
        windows = sliding_window_view(padded, reach, axis=tuple(range(2, x.ndim)))
        return windows[(slice(None), slice(None),
                        *(slice(0, o * s, s) for o, s in zip(self.out, self.strides,
                                                             strict=True)),
                        *(slice(None, None, d) for d in self.dilations))]

    def taps(self, spatial: tuple[int, ...], include_pad: bool) -> np.ndarray:
        """Per window, how many of its taps land inside the input (`include_pad`: inside
        the explicitly padded input), shape (*out,)."""
        inside = np.ones((1, 1, *spatial))
        if not include_pad:
            return self.view(inside, 0).sum(axis=self.axes(2))[0, 0]
        inside = np.pad(inside, [(0, 0), (0, 0), *zip(self.begin, self.end, strict=True)],
                        constant_values=1)
        unpadded = replace(self, begin=(0,) * len(spatial))
        return unpadded.view(inside, 0).sum(axis=self.axes(2))[0, 0]

    def axes(self, first: int) -> tuple[int, ...]:
        """The window axes of a view of `first` + len(out) leading axes."""
        n = len(self.kernel)
        return tuple(range(first + n, first + 2 * n))


def _accumulator(dtype: np.dtype) -> type:
    return np.float64 if dtype == np.float64 else np.float32


class MaxPool(OpRun):
    def _run(self, x, **attrs):
        win = PoolWindows.of(x.shape[2:], attrs)
        fill = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
        windows = win.view(x, fill)
        y = windows.max(axis=win.axes(2))
        if len(self.onnx_node.output) < 2 or not self.onnx_node.output[1]:
            return (y,)
        return y, self._indices(win, windows, x.shape, attrs.get("storage_order") or 0)

    @staticmethod
    def _indices(win: PoolWindows, windows: np.ndarray, shape: tuple[int, ...],
                 storage_order: int) -> np.ndarray:
        """Each maximum's flat position in the input, the first one in a tie, the spatial
        axes in column-major order with `storage_order` 1 (as onnxruntime counts)."""
        n = len(win.kernel)
        lead = windows.shape[:2 + n]
        taps = np.unravel_index(windows.reshape(*lead, -1).argmax(axis=-1), win.kernel)
        spatial = shape[2:]
        flat = np.zeros(lead, np.int64)
        order = range(n) if storage_order == 0 else reversed(range(n))
        for i in order:
            pos = (np.arange(win.out[i]) * win.strides[i] - win.begin[i]).reshape(
                (-1,) + (1,) * (n - 1 - i)) + taps[i] * win.dilations[i]
            flat = flat * spatial[i] + pos
        channels = np.arange(math.prod(shape[:2])).reshape(shape[:2] + (1,) * n)
        return flat + channels * math.prod(spatial)


class AveragePool(OpRun):
    def _run(self, x, **attrs):
        win = PoolWindows.of(x.shape[2:], attrs)
        sums = win.view(x, 0).sum(axis=win.axes(2), dtype=_accumulator(x.dtype))
        taps = win.taps(x.shape[2:], bool(attrs.get("count_include_pad")))
        return ((sums / taps).astype(x.dtype),)


class LpPool(OpRun):
    def _run(self, x, **attrs):
        win = PoolWindows.of(x.shape[2:], attrs)
        p = attrs.get("p", 2)
        powers = np.abs(win.view(x, 0)).astype(_accumulator(x.dtype)) ** p
        return ((powers.sum(axis=win.axes(2)) ** (1.0 / p)).astype(x.dtype),)


class LRN(OpRun):
    """Each channel over its window of channels."""

    def _run(self, x, size, alpha=1e-4, beta=0.75, bias=1.0):
        below = (size - 1) // 2
        squares = np.pad(x.astype(_accumulator(x.dtype)) ** 2,
                         [(0, 0), (below, size - 1 - below)] + [(0, 0)] * (x.ndim - 2))
        window = sliding_window_view(squares, size, axis=1).sum(axis=-1)
        return ((x / (bias + alpha / size * window) ** beta).astype(x.dtype),)


class GridSample(OpRun):
    """Every output position at once, as onnxruntime and PyTorch sample: each axis's
    coordinate unnormalized, rounded half to even (nearest), padded (border: clipped,
    except for cubic; reflection: reflected into the grid's bounds), then its taps (one,
    two, or four weighted by Keys' cubic with a = -0.75), each tap padded again (zeros:
    reads 0 outside) and every combination of the axes' taps summed."""

    def _run(self, X, grid, mode=None, padding_mode=None, align_corners=None):
        mode = mode or getattr(self, "mode", None) or "linear"
        mode = _RENAMED.get(mode, mode)
        padding = padding_mode or getattr(self, "padding_mode", None) or "zeros"
        corners = bool(align_corners or getattr(self, "align_corners", 0))
        n, c, *size = X.shape
        axes = [_grid_taps(grid[..., len(size) - 1 - k], d, mode, padding, corners)
                for k, d in enumerate(size)]
        values = np.moveaxis(X, 1, -1)  # (n, *size, c): a gather's channels last
        batch = np.arange(n).reshape(n, *[1] * (grid.ndim - 2))
        out = np.zeros((*grid.shape[:-1], c), X.dtype)
        for combination in itertools.product(*axes):
            weight = np.prod([w for _, w in combination], axis=0)
            out += values[(batch, *(i for i, _ in combination))] * weight[..., None]
        return (np.moveaxis(out, -1, 1),)


def _grid_taps(g: np.ndarray, size: int, mode: str, padding: str, corners: bool
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """One axis's taps for every output position: (index, weight), a tap outside the
    input weighing 0 under zeros padding."""
    v = (g + 1) / 2 * (size - 1) if corners else ((g + 1) * size - 1) / 2
    low, high = (0.0, size - 1.0) if corners else (-0.5, size - 0.5)
    if mode == "nearest":
        v = np.rint(v)
    if padding == "border" and mode != "cubic":
        v = np.clip(v, 0, size - 1)
    elif padding == "reflection":
        v = _reflected(v, low, high)
    if mode == "nearest":
        taps = [(v, np.ones_like(v))]
    else:
        start = np.floor(v)
        t = v - start
        weights = [1 - t, t] if mode == "linear" else _cubic(t)
        taps = [(start + i - (mode == "cubic"), w) for i, w in enumerate(weights)]
    out = []
    for at, weight in taps:
        if padding == "reflection":
            at = np.trunc(_reflected(at, low, high))
        inside = (at >= 0) & (at <= size - 1)
        index = np.clip(at, 0, size - 1).astype(np.int64)
        out.append((index, weight if padding != "zeros" else weight * inside))
    return out


def _reflected(v: np.ndarray, low: float, high: float) -> np.ndarray:
    """`v` reflected off `low` and `high` until within them (PyTorch's reflect_coordinates)."""
    span = high - low
    if span <= 0:
        return np.zeros_like(v)
    below, above = v < low, v > high
    away = np.where(below, low - v, v - high)
    flips = np.floor(away / span)
    rest = away - flips * span
    even = flips % 2 == 0
    return np.where(below, np.where(even, low + rest, high - rest),
                    np.where(above, np.where(even, high - rest, low + rest), v))


def _cubic(t: np.ndarray) -> list[np.ndarray]:
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1 and 2 from the
    floor, `t` past it."""
    a = -0.75
    near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # noqa: E731 (|x| <= 1)
    far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # noqa: E731 (1 < |x| < 2)
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


_RENAMED = {"bilinear": "linear", "bicubic": "cubic"}


class GatherElements(OpRun):
    """`take_along_axis` over the data cut to the indices' size off the axis (as PyTorch's
    gather), negative indices from the end."""

    def _run(self, data, indices, axis=0):
        axis %= data.ndim
        cut = tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(indices.shape))
        indices = np.where(indices < 0, indices + data.shape[axis], indices).astype(np.int64)
        return (np.take_along_axis(data[cut], indices, axis=axis),)


class GlobalMaxPool(OpRun):
    def _run(self, x):
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)


class BatchNormalization(BatchNormalization_14):
    """Every opset's node as opset 14's: its one output from the statistics given (older
    opsets' `is_test`, `spatial` and `consumed_inputs` say nothing more for it)."""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None,
             training_mode=None, **_):
        return super()._run(x, scale, bias, mean, var, epsilon, momentum, training_mode)


class Loop(_Loop):
    """Each iteration's scan outputs a slice of a new first axis: the evaluator's vstack
    then stacks them; a scalar's column is made a vector again."""

    _run_body: Callable[..., Any]  # the evaluator sets it, from the `body` attribute

    def __init__(self, onnx_node, run_params):
        super().__init__(onnx_node, run_params)
        body, self._scalars = self._run_body, threading.local()

        def sliced(*args, **kwargs):
            outputs = list(body(*args, **kwargs))
            first = len(outputs) - self.K
            self._scalars.seen = [np.ndim(o) == 0 for o in outputs[first:]]
            outputs[first:] = [np.expand_dims(o, 0) for o in outputs[first:]]
            return outputs

        self._run_body = sliced

    def _run(self, *args, **kwargs):
        self._scalars.seen = [False] * self.K
        out = list(super()._run(*args, **kwargs))
        for k, scalar in enumerate(self._scalars.seen):
            if scalar:
                out[self.N + k] = out[self.N + k].reshape(-1)
        return tuple(out)


_NEAREST: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5), "floor": np.floor, "ceil": np.ceil}


class Resize(_Resize):
    """`tf_half_pixel_for_nn`: output index i of a scaled axis samples input
    (i + 0.5) / scale, rounded by `nearest_mode` and clipped, as onnxruntime does; every
    other mode the evaluator's."""

    def _run(self, X, roi, scales=None, sizes=None, **attrs):  # type: ignore[override]
        if attrs.get("coordinate_transformation_mode") != "tf_half_pixel_for_nn" or \
                attrs.get("axes") is not None:
            return super()._run(X, roi, scales, sizes, **attrs)
        if sizes is not None and len(sizes):
            scales = np.asarray(sizes) / np.asarray(X.shape)
        rounded = _NEAREST[attrs.get("nearest_mode") or "round_prefer_floor"]
        taken = [np.arange(n) if s == 1 else  # an axis kept whole (onnxruntime's too)
                 np.clip(rounded((np.arange(int(n * s)) + 0.5) / s), 0, n - 1).astype(np.int64)
                 for n, s in zip(X.shape, np.asarray(scales, np.float64), strict=True)]
        return (X[np.ix_(*taken)],)


class Upsample(_Resize):
    """Resize's interpolation with Upsample's coordinates (input i / scale, nearest rounding
    down), as onnxruntime runs it: the scales an input from opset 9, an attribute at 7."""

    def _run(self, X, scales=None, mode=None):  # type: ignore[override]
        return super()._run(X, None, np.asarray(scales, np.float32), mode=mode,
                            coordinate_transformation_mode="asymmetric", nearest_mode="floor")


class DequantizeLinear(_CommonDequantizeLinear):
    """Every opset's node: the attributes its opset has (`axis` from 13, `block_size` from
    21, `output_dtype` from 23), the defaults otherwise."""

    def _run(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=None):
        return super()._run(x, x_scale, x_zero_point, axis, block_size, output_dtype)


class ZipMap(OpRun):
    """Each row of class scores as a map from the class labels, as onnxruntime gives it:
    a list of dicts."""

    op_domain = "ai.onnx.ml"

    def _run(self, x, classlabels_int64s=None, classlabels_strings=None):
        labels = classlabels_strings if classlabels_int64s is None else classlabels_int64s
        return ([dict(zip(labels, row.tolist(), strict=True)) for row in x],)


KERNELS = (ConvTranspose, MaxPool, AveragePool, LpPool, LRN, GridSample, GatherElements,
           GlobalMaxPool, BatchNormalization, Loop, Resize, Upsample, DequantizeLinear, ZipMap)
