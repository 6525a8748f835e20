"""Decompositions of the fused operators PyTorch's transformer fast path calls.

In eval mode without gradients, `nn.TransformerEncoderLayer` and `nn.MultiheadAttention`
call one fused operator each (`aten._transformer_encoder_layer_fwd`,
`aten._native_multi_head_attention`), which ONNX cannot express. These write them out in
the operators they fuse (linear, softmax attention, layer norm, the feed-forward), the same
arithmetic as the slow path, so the layer offloads as a whole. With a mask they decline
(NotImplemented) and the fused operator stays, in PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, num_head: int,
               qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, proj_weight: torch.Tensor,
               proj_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-first multi-head attention: (output, per-head weights)."""
    embed = qkv_weight.size(1)
    w_q, w_k, w_v = qkv_weight.split(embed)
    b_q, b_k, b_v = qkv_bias.split(embed)
    batch, target, source = query.size(0), query.size(1), key.size(1)
    head = embed // num_head

    def heads(x: torch.Tensor, length: int) -> torch.Tensor:
        return x.reshape(batch, length, num_head, head).transpose(1, 2)

    q = heads(F.linear(query, w_q, b_q), target)
    k = heads(F.linear(key, w_k, b_k), source)
    v = heads(F.linear(value, w_v, b_v), source)
    weights = torch.softmax(q @ k.transpose(-2, -1) * head ** -0.5, dim=-1)
    context = (weights @ v).transpose(1, 2).reshape(batch, target, embed)
    return F.linear(context, proj_weight, proj_bias), weights


def native_multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                embed_dim: int, num_head: int, qkv_weight: torch.Tensor,
                                qkv_bias: torch.Tensor, proj_weight: torch.Tensor,
                                proj_bias: torch.Tensor, mask: torch.Tensor | None = None,
                                need_weights: bool = True, average_attn_weights: bool = True,
                                mask_type: int | None = None) -> Any:
    if mask is not None or query.dim() != 3:
        return NotImplemented
    output, weights = _attention(query, key, value, num_head, qkv_weight, qkv_bias,
                                 proj_weight, proj_bias)
    if not need_weights:
        return output, query.new_empty(0)
    return output, weights.mean(dim=1) if average_attn_weights else weights


def transformer_encoder_layer_fwd(src: torch.Tensor, embed_dim: int, num_heads: int,
                                  qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                                  proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                                  use_gelu: bool, norm_first: bool, eps: float,
                                  norm_weight_1: torch.Tensor, norm_bias_1: torch.Tensor,
                                  norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
                                  ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor,
                                  ffn_weight_2: torch.Tensor, ffn_bias_2: torch.Tensor,
                                  mask: torch.Tensor | None = None,
                                  mask_type: int | None = None) -> Any:
    if mask is not None or src.dim() != 3:
        return NotImplemented
    shape = (embed_dim,)

    def norm1(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps)

    def norm2(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return F.linear(hidden, ffn_weight_2, ffn_bias_2)

    def attend(x: torch.Tensor) -> torch.Tensor:
        return _attention(x, x, x, num_heads, qkv_weight, qkv_bias, proj_weight,
                          proj_bias)[0]

    if norm_first:
        x = src + attend(norm1(src))
        return x + feed_forward(norm2(x))
    x = norm1(src + attend(src))
    return norm2(x + feed_forward(x))


FAST_PATH: dict[Any, Callable] = {
    aten._native_multi_head_attention.default: native_multi_head_attention,
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
}
