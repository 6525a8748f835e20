"""Models past protobuf's 2 GB. Such a model reads and lives in memory, but does not
serialize: shape inference, the checker and onnxruntime-from-bytes cannot be handed it,
and asking its size (`ByteSize`) encodes all of it (seconds a gigabyte) before it fails.
So its size is read off its tensors' dims, and what needs it whole gets a `shell`: the
model with each large initializer replaced (by its type and dims alone, or by a reference
to external data), nothing of the weights copied.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import onnx
from google.protobuf.message import Message
from onnx import helper

LIMIT = onnx.checker.MAXIMUM_PROTOBUF  # 2 GB: protobuf serializes no more
LARGE_INIT = 1 << 10  # a weight a shell leaves apart: no shape is read off one as long
ROOM = 64 << 20  # what a model holds besides its tensors' data, at most (`too_large`)


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes a tensor's data takes, from its dims and type (nothing copied)."""
    try:
        item = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        item = 1
    return math.prod(tensor.dims) * item


def too_large(model: onnx.ModelProto) -> bool:
    """Would the model not serialize? Its initializers and constants' bytes, with
    `ROOM` for the rest (names, nodes, attributes), reach 2 GB."""
    constants = (a.t for n in model.graph.node for a in n.attribute
                 if a.type == onnx.AttributeProto.TENSOR)
    return past_limit(sum(tensor_bytes(t) for t in (*model.graph.initializer, *constants)))


def past_limit(held: int) -> bool:
    """Would a model holding `held` bytes of tensors not serialize (with `ROOM` for the
    rest)?"""
    return held >= LIMIT - ROOM


def shell(model: onnx.ModelProto, payload: Callable[[onnx.TensorProto], onnx.TensorProto],
          at_least: int = LARGE_INIT) -> onnx.ModelProto:
    """A copy of `model` in which each initializer of `at_least` bytes or more is what
    `payload` makes of it; the rest is copied."""
    out = onnx.ModelProto()
    for described, value in model.ListFields():
        if described.name != "graph":
            _copy_field(out, described.name, value)
    for described, value in model.graph.ListFields():
        if described.name != "initializer":
            _copy_field(out.graph, described.name, value)
    for init in model.graph.initializer:
        out.graph.initializer.append(payload(init) if tensor_bytes(init) >= at_least
                                     else init)
    return out


def typed_only(init: onnx.TensorProto) -> onnx.TensorProto:
    """An initializer's name, type and dims: what shape inference reads of a weight."""
    return onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)


def inferable(model: onnx.ModelProto) -> onnx.ModelProto:
    """What shape inference takes: the model, or its shell of typed weights if it holds
    one (`LARGE_INIT`). Handing weights over costs seconds a gigabyte, and peak memory
    three times their size (encoded, copied, decoded back), and no shape rests on them;
    past 2 GB it is the only way. A model of 190 weights of 500 KB, left whole below a
    1 MB bound, peaked at 7x its weights as it loaded (2x since)."""
    large = any(tensor_bytes(t) >= LARGE_INIT for t in model.graph.initializer)
    return shell(model, typed_only) if large else model


def checked(model: onnx.ModelProto, checked_apart: frozenset[str] = frozenset()) -> None:
    """onnx's checker on `model` (ValidationError), its large initializers one at a time:
    whole, it would copy every weight twice at once (encoded, then decoded in C++), for a
    check that reads each on its own. Past 2 GB the only way to check it in memory.
    `checked_apart`: weights checked where they lie as they were read (`runtime.stored`)."""
    onnx.checker.check_model(shell(model, _dataless))
    for init in model.graph.initializer:
        if tensor_bytes(init) >= LARGE_INIT and init.name not in checked_apart:
            onnx.checker.check_tensor(init)


def _dataless(init: onnx.TensorProto) -> onnx.TensorProto:
    """A tensor of no elements by the initializer's name and type: what the model's check
    needs of it (the tensor's own is `check_tensor`)."""
    return onnx.TensorProto(name=init.name, data_type=init.data_type, dims=[0])


def _copy_field(message: Message, name: str, value: Any) -> None:
    if isinstance(value, Message):
        getattr(message, name).CopyFrom(value)
    elif isinstance(value, str | bytes | int | float | bool):
        setattr(message, name, value)
    else:  # a repeated field
        getattr(message, name).extend(value)

