"""Triton's classification extension: an output asked for with `"classification": N`
comes back as BYTES, the N largest of its values as "value:index[:label]" text, largest
first (per batch row when the model batches, as Triton's `max_batch_size` says; over the
whole tensor otherwise). Values are written as C++'s `std::to_string` writes them (floats
to six decimals), so a client parsing Triton's answers parses these alike."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from app.server.tensors import TensorError, datatype


def top_classes(name: str, array: np.ndarray, count: int, batched: bool,
                labels: Sequence[str] = ()) -> np.ndarray:
    """[batch, k] (batched) or [k] text elements, k = min(count, values per row)."""
    if array.dtype.kind not in "iuf" or array.dtype == np.float16:
        raise TensorError(f"output {name!r} is {datatype(array.dtype)}: classification takes "
                          f"integer, FP32 or FP64 outputs (as Triton's)")
    batched = batched and array.ndim > 0
    rows = array.reshape(len(array), math.prod(array.shape[1:])) if batched else \
        array.reshape(1, array.size)
    k = min(count, rows.shape[1])
    # largest first, equal values by index: a stable sort of the columns reversed
    order = rows.shape[1] - 1 - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1][:, :k]
    text = "{:f}:{}" if array.dtype.kind == "f" else "{}:{}"
    out = np.empty((len(rows), k), dtype=object)
    for r, (values, picked) in enumerate(zip(rows.tolist(), order.tolist(), strict=True)):
        out[r] = [text.format(values[i], i) + (f":{labels[i]}" if i < len(labels) else "")
                  for i in picked]
    return out if batched else out[0]
