"""Tensors across the border: torch to numpy and back, sharing memory wherever it can."""

from __future__ import annotations

import numpy as np
import torch


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a cpu tensor's memory (strides kept, nothing copied); a lazily
    conjugated or negated tensor is materialized first."""
    tensor = tensor.detach()
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    return tensor.numpy()


def to_torch(array: np.ndarray, copy: bool = False) -> torch.Tensor:
    """A tensor over the array's memory. `copy` for an array the host keeps and hands out
    again (a constant output), or one that is read-only."""
    if copy or not array.flags.writeable:
        array = np.array(array)
    return torch.from_numpy(array)


def _hint(size: object) -> int | None:
    """A size as traced: an int, or the value a symbolic size had when traced."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return hint if isinstance(hint, int) else None


def layout_of(traced: torch.Tensor) -> tuple[int, ...] | None:
    """The order of a traced tensor's dimensions in memory, outermost first, when it is not
    the row-major order; None when it is (or cannot be told).

    The graph after a block was traced with this layout: a `view` PyTorch runs on it later
    may need it, so a block's output is laid out so again (ONNX outputs are row-major).
    A dimension of one, or a broadcast one (stride 0: transformers' `repeat_kv` of a single
    key head), takes no room and keeps its place: sorted by its stride of 0 it went
    innermost, and PyTorch's cpu attention backward misreads a key whose last dimension is
    not innermost."""
    sizes, strides = [_hint(s) for s in traced.shape], [_hint(s) for s in traced.stride()]
    if None in sizes or None in strides:
        return None
    placed = [d for d in range(traced.dim()) if strides[d] and sizes[d] != 1]
    inner = iter(sorted(placed, key=lambda d: -strides[d]))  # type: ignore[operator]
    order = tuple(next(inner) if d in placed else d for d in range(traced.dim()))
    return None if order == tuple(range(traced.dim())) else order


def laid_out(tensor: torch.Tensor, layout: tuple[int, ...] | None) -> torch.Tensor:
    """`tensor` with its dimensions in memory in `layout`'s order (a copy), or itself."""
    if layout is None or tensor.dim() != len(layout):
        return tensor
    return torch.empty_permuted(tensor.shape, layout, dtype=tensor.dtype).copy_(tensor)
