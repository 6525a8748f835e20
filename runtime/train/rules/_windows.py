"""Sliding-window geometry shared by Conv, MaxPool and AveragePool: a node's explicit
pads (auto_pad resolved), and the ConvTranspose that spreads a window-wise gradient back
over the input's exact shape."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from runtime.devices.reference_ops import same_pads
from runtime.train.registry import Grad


@dataclass(frozen=True)
class Windows:
    spatial: tuple[int, ...]  # the input's spatial size
    out: tuple[int, ...]  # the output's
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]  # pads
    end: tuple[int, ...]

    @classmethod
    def of(cls, g: Grad, kernel: tuple[int, ...], adjoint: bool = False) -> Windows:
        """The node's windows; `adjoint`: it is a ConvTranspose, and these are the windows
        of the Conv it is the adjoint of, from its output's space to its input's. Its
        output padding then counts in SAME's total, and an `output_shape` pads as
        SAME_LOWER does (onnx's spec, as onnxruntime computes it)."""
        spatial, out = tuple(g.shape(g.x())[2:]), tuple(g.shape(g.y())[2:])
        if adjoint:
            spatial, out = out, spatial
        n = len(spatial)
        strides = tuple(g.attr("strides") or [1] * n)
        dilations = tuple(g.attr("dilations") or [1] * n)
        auto = g.attr("auto_pad", "NOTSET")
        extra = (g.attr("output_padding") if adjoint else None) or [0] * n
        if auto in ("SAME_UPPER", "SAME_LOWER") or (
                adjoint and auto == "NOTSET" and g.attr("output_shape")):
            begin, end = [], []
            for size, o, k, s, d, p in zip(spatial, out, kernel, strides, dilations, extra,
                                           strict=True):
                b, e = same_pads(max(0, (o - 1) * s + (k - 1) * d + 1 + p - size), auto)
                begin.append(b)
                end.append(e)
            return cls(spatial, out, kernel, strides, dilations, tuple(begin), tuple(end))
        pads = g.attr("pads") or [0] * 2 * n
        if auto == "VALID":
            pads = [0] * 2 * n
        return cls(spatial, out, kernel, strides, dilations, tuple(pads[:n]), tuple(pads[n:]))

    def within(self) -> Windows:
        """These windows cut to the padded input: a tap past its end reaches nothing, and
        a pool of a window wider than its input (HF's EfficientNet pools globally with one
        as wide as its hidden size, and ceil_mode) would spread over a kernel that wide."""
        kernel = tuple(min(k, (b + size + e - 1) // d + 1) for size, k, d, b, e in zip(
            self.spatial, self.kernel, self.dilations, self.begin, self.end, strict=True))
        return replace(self, kernel=kernel)

    def spread(self) -> dict:
        """ConvTranspose attributes that map the output's positions back onto exactly the
        input's: windows reaching past the padded input (ceil_mode) crop more at the end,
        a remainder the last window never reached is added as output padding."""
        end, extra = [], []
        for size, o, k, s, d, b, e in zip(self.spatial, self.out, self.kernel, self.strides,
                                          self.dilations, self.begin, self.end, strict=True):
            reach = (o - 1) * s + (k - 1) * d + 1
            if reach - b - e >= size:
                end.append(reach - b - size)
                extra.append(0)
            else:
                end.append(e)
                extra.append(size - (reach - b - e))
        return {"kernel_shape": list(self.kernel), "strides": list(self.strides),
                "dilations": list(self.dilations), "pads": [*self.begin, *end],
                "output_padding": extra}

    def taps(self, include_pad: bool) -> list[list[int]]:
        """Per spatial axis, how many of each window's taps land inside the input (or,
        with `include_pad`, inside the padded input)."""
        counts = []
        for size, o, k, s, d, b, e in zip(self.spatial, self.out, self.kernel, self.strides,
                                          self.dilations, self.begin, self.end, strict=True):
            low, high = (-b, size + e) if include_pad else (0, size)
            counts.append([sum(low <= i * s - b + t * d < high for t in range(k))
                           for i in range(o)])
        return counts


def kernel_of(g: Grad) -> tuple[int, ...]:
    return tuple(g.attr("kernel_shape"))


def volume(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
