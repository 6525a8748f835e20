"""Attention as PyTorch's cpu kernel computes it, written out with the logsumexp it saves.

On the cpu, `F.scaled_dot_product_attention` calls `_scaled_dot_product_flash_attention_for_cpu`,
which returns the attention and, for the backward pass, the logsumexp of each query's
scores. torch.onnx's translation returns zeros for the latter, so in a training graph each
attention stayed in PyTorch and cut the graph into a block per layer. Written out (the
scaled scores, the causal mask from the top left or the additive mask, softmax), with the
logsumexp beside it, the layer leaves PyTorch whole; a graph that reads no logsumexp
(inference) exports none, and computes what torch.onnx's translation does. A row whose
mask hides every key is PyTorch's: zeros, logsumexp 0. With fewer key/value heads than
query heads (grouped-query attention, `enable_gqa`), each serves its group of query heads.
Dropout (random) and dtypes other than float32 and float64 decline and stay in PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def flash_attention_for_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            dropout_p: float = 0.0, is_causal: bool = False, *,
                            attn_mask: torch.Tensor | None = None,
                            scale: float | None = None) -> Any:
    if dropout_p > 0 or query.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    groups = query.size(-3) // key.size(-3)  # grouped-query: a key/value head per group
    if groups > 1:
        key, value = key.repeat_interleave(groups, -3), value.repeat_interleave(groups, -3)
    scores = query @ key.transpose(-2, -1) * (query.size(-1) ** -0.5 if scale is None
                                              else scale)
    if is_causal:
        above = torch.ones(scores.shape[-2:], dtype=torch.bool, device=query.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    if attn_mask is not None:
        scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    if attn_mask is not None:  # a row masking every key: 0/0, where PyTorch answers zeros
        weights = weights.nan_to_num(0.0)
    logsumexp = torch.logsumexp(scores, dim=-1)
    return weights @ value, logsumexp.masked_fill(logsumexp.isinf(), 0.0)


ATTENTION: dict[Any, Callable] = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_for_cpu,
}
