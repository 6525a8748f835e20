"""Operators kept in PyTorch although torch.onnx translates them: the qualification sweep
(`python -m tests.torch.sweep`, table in docs/torch_ops.md) found their ONNX answers differ
from PyTorch's, always or for some arguments. Operator (an overload, or a packet for every
overload) -> the refusal, as the report prints it."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


def _always(arguments: Mapping[str, object]) -> bool:
    return True


@dataclass(frozen=True)
class Refusal:
    reason: str
    when: Callable[[Mapping[str, object]], bool] = _always  # the call's arguments by name


# onnxruntime's inference kernels normalize with the running statistics whatever ONNX's
# `training_mode` says, where PyTorch in training normalizes with the batch's own; only
# what training_norm.py does not write out (float16) gets here
_TRAINING_NORM = Refusal("batch norm in training mode: onnxruntime normalizes with the "
                         "running statistics, PyTorch with the batch's")
_DIVISOR = Refusal("a divisor_override: torch.onnx's translation ignores it",
                   lambda arguments: arguments.get("divisor_override") is not None)

_MEAN = Refusal("reduce='mean': torch.onnx's translation averages otherwise than PyTorch "
                "where indices repeat", lambda arguments: arguments.get("reduce") == "mean")


def _few_values(arguments: Mapping[str, object]) -> bool:
    """Does the reduction see no more values than its correction (or, dynamic, maybe)?"""
    source = arguments.get("self", arguments.get("inp"))  # aten's name, prims'
    shape = getattr(getattr(source, "meta", {}).get("val"), "shape", None)
    if shape is None:
        return True
    dims = arguments.get("dim", arguments.get("dims"))
    axes: Iterable = dims if isinstance(dims, list | tuple) and dims else \
        [dims] if isinstance(dims, int) else range(len(shape))
    count = math.prod(shape[d] for d in axes)
    correction = arguments.get("correction")
    if correction is None:
        correction = 1 if arguments.get("unbiased", True) else 0
    return not isinstance(count, int) or not isinstance(correction, int | float) \
        or count - correction <= 0


_TAILS = Refusal("its far tail: torch.onnx's translation loses it (0 or inf where PyTorch "
                  "answers finite values)")

_FEW = Refusal("as many values as its correction or fewer: PyTorch answers NaN or inf, "
               "torch.onnx's translation 0", _few_values)

REFUSED: dict[str, Refusal] = {
    "aten._native_batch_norm_legit_functional": _TRAINING_NORM,
    "aten._native_batch_norm_legit.default": _TRAINING_NORM,
    "aten._native_batch_norm_legit.no_stats": _TRAINING_NORM,
    "aten.native_batch_norm": _TRAINING_NORM,
    "aten._batch_norm_with_update": _TRAINING_NORM,
    "aten._batch_norm_with_update_functional": _TRAINING_NORM,
    "aten.avg_pool2d": _DIVISOR,
    "aten.avg_pool3d": _DIVISOR,
    "aten.scatter_reduce": _MEAN,
    "aten.var": _FEW, "aten.var_mean": _FEW, "aten.std": _FEW, "aten.std_mean": _FEW,
    "prims.var": _FEW,
    "aten.special_erfcx": _TAILS,
}

# Operators whose first output is right but whose other outputs (kept for the backward
# pass) are not what PyTorch makes: offloaded only where nothing reads the others.
FIRST_OUTPUT_ONLY: dict[str, str] = {
    # reached only where attention.py declines to write it out (float16, dropout)
    "aten._scaled_dot_product_flash_attention_for_cpu":
        "its logsumexp output (kept for gradients) is not PyTorch's",
    # torchlib makes total_weight 1, so a mean loss's gradient comes out batch-size times
    "aten.nll_loss_forward": "its total_weight output (kept for gradients) is not PyTorch's",
    "aten._embedding_bag": "its offset2bag, bag_size and max_indices outputs (kept for "
                           "gradients) are not PyTorch's",
}

# Functions PyTorch decomposes while AOT autograd lowers a graph (a Python kernel at the
# Autograd key, whatever decomposition table the backend passes) into something that is
# not what their kernel computes: a captured graph calling one runs in PyTorch whole.
WRONGLY_DECOMPOSED: dict[str, str] = {
    "multilabel_margin_loss": "PyTorch's decomposition of multilabel_margin_loss differs "
                              "from its kernel where a target holds -1 padding",
}


def wrongly_decomposed(targets: Iterable[object]) -> str | None:
    """Why a graph calling these functions or operators must run in PyTorch, or None."""
    for target in targets:  # a function, or an operator (its packet: aten.X_forward)
        name = getattr(getattr(target, "overloadpacket", target), "__name__", "")
        if (why := WRONGLY_DECOMPOSED.get(name.removesuffix("_forward"))) is not None:
            return why
    return None
