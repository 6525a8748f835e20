"""What BatchNormalization and InstanceNormalization share as trained: statistics taken
over some axes of x, and each channel (axis 1) scaled and shifted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.train.registry import Rewriting


@dataclass(frozen=True)
class Normalized:
    mean: str  # over `axes`, kept as dims of 1
    var: str  # biased
    out: str  # the node's first output


def normalize(r: Rewriting, axes: Sequence[int]) -> Normalized:
    """Write (x - mean) / sqrt(var + epsilon) * scale + bias, scale and bias per channel,
    into the node's first output."""
    e, (x, scale, bias) = r.e, r.node.input[:3]
    shape = r.shape(x)
    per_channel = [1, shape[1], *[1] * (len(shape) - 2)]
    mean = e.mean(x, axes)
    centred = e.op("Sub", [x, mean])
    var = e.mean(e.op("Mul", [centred, centred]), axes)
    inv = e.op("Reciprocal", [e.op("Sqrt", [e.op("Add", [var, r.const(r.attr(
        "epsilon", 1e-5), x)])])])
    scaled = e.op("Mul", [e.op("Mul", [centred, inv]), e.reshape(scale, per_channel)])
    e.ops("Add", [scaled, e.reshape(bias, per_channel)], [r.node.output[0]])
    return Normalized(mean, var, r.node.output[0])
