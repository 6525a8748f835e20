"""Batch norm in training mode written out in operators onnxruntime computes as PyTorch does.

torch.onnx translates `_native_batch_norm_legit_functional` to ONNX's BatchNormalization
with `training_mode`, but onnxruntime's inference kernels normalize with the running
statistics whatever that says. Written out (the batch's mean and biased variance, the
running statistics moved by `momentum` towards them, the unbiased variance as PyTorch
keeps it), a training network's batch norms leave PyTorch with the convolutions around
them, instead of cutting the graph into a block per convolution. The mean and inverse
standard deviation it saves are the ones PyTorch's backward reads. Other dtypes than
float32 and float64 (PyTorch computes float16 in float32) decline, and stay in PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _normalized(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, the batch's mean, its inverse standard deviation, its biased variance),
    the last three per channel."""
    axes = [0, *range(2, input.dim())]
    channels = (1, -1) + (1,) * (input.dim() - 2)
    mean = input.mean(dim=axes, keepdim=True)
    centered = input - mean
    variance = (centered * centered).mean(dim=axes, keepdim=True)
    rstd = torch.rsqrt(variance + eps)
    output = centered * rstd
    if weight is not None:
        output = output * weight.reshape(channels)
    if bias is not None:
        output = output + bias.reshape(channels)
    return output, mean.reshape(-1), rstd.reshape(-1), variance.reshape(-1)


def _written_out(input: torch.Tensor) -> bool:
    return input.dtype in (torch.float32, torch.float64) and input.dim() >= 2


def batch_norm_functional(input: torch.Tensor, weight: torch.Tensor | None,
                          bias: torch.Tensor | None, running_mean: torch.Tensor,
                          running_var: torch.Tensor, training: bool, momentum: float,
                          eps: float) -> Any:
    if not training or not _written_out(input):
        return NotImplemented
    output, mean, rstd, variance = _normalized(input, weight, bias, eps)
    count = input.numel() // input.size(1)  # a size: an int, or a SymInt when dynamic
    unbiased = variance * count / (count - 1)
    return (output, mean, rstd, running_mean * (1 - momentum) + mean * momentum,
            running_var * (1 - momentum) + unbiased * momentum)


def batch_norm_with_update(input: torch.Tensor, weight: torch.Tensor | None,
                           bias: torch.Tensor | None, running_mean: torch.Tensor,
                           running_var: torch.Tensor, momentum: float, eps: float) -> Any:
    """As `batch_norm_functional` in training, with cuDNN's reserve (none on the cpu)."""
    written = batch_norm_functional(input, weight, bias, running_mean, running_var, True,
                                    momentum, eps)
    if written is NotImplemented:
        return written
    output, mean, rstd, new_mean, new_var = written
    return output, mean, rstd, input.new_empty((0,), dtype=torch.uint8), new_mean, new_var


def batch_norm_no_stats(input: torch.Tensor, weight: torch.Tensor | None,
                        bias: torch.Tensor | None, training: bool, momentum: float,
                        eps: float) -> Any:
    if not training or not _written_out(input):
        return NotImplemented
    return _normalized(input, weight, bias, eps)[:3]


TRAINING_NORM: dict[Any, Callable] = {
    aten._native_batch_norm_legit_functional.default: batch_norm_functional,
    aten._native_batch_norm_legit.no_stats: batch_norm_no_stats,
    aten._batch_norm_with_update_functional.default: batch_norm_with_update,
}
