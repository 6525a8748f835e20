"""External data held in memory: put back into a model, for what reads a ModelProto whole
(the reference evaluator, export-onnx) rather than handing onnxruntime the files; and
made, for a model too large to serialize with its weights in it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from runtime.large import shell, tensor_bytes, too_large, typed_only


def inline_external(model: onnx.ModelProto, files: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """Every initializer stored in one of `files` (name -> bytes) gets its bytes back, in
    place; others are left as they are."""
    for init in model.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = {e.key: e.value for e in init.external_data}
        data = files.get(where.get("location", ""))
        if data is None:
            continue
        start = int(where.get("offset", 0))
        length = int(where["length"]) if "length" in where else data.size - start
        init.raw_data = data[start:start + length].tobytes()
        del init.external_data[:]
        init.data_location = onnx.TensorProto.DEFAULT
    return model


def pointed(tensor: onnx.TensorProto, location: str, offset: int, length: int
            ) -> onnx.TensorProto:
    """`tensor`, its data named as bytes [offset, offset + length) of the external file
    `location`, as ONNX writes external data (its own bytes, if any, left to the caller)."""
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        tensor.external_data.add(key=key, value=str(value))
    return tensor


IN_MEMORY = "prism-held.bin"  # the file a model past 2 GB names its weights in
HELD_MIN = 1 << 10  # an initializer of this many bytes or more goes there (as in a bundle)
HOLD_FROM = 64 << 20  # a model with this many bytes of such weights holds them there


def serialized(model: onnx.ModelProto, location: str = IN_MEMORY
               ) -> tuple[bytes, dict[str, np.ndarray]]:
    """The model's bytes, and the files they name as external data, held in memory: what
    `session_options` hands onnxruntime. Past protobuf's 2 GB, or from HOLD_FROM bytes of
    weights, each initializer of HELD_MIN bytes or more moves to one such file (as a
    bundle's weights.bin): a model of any size loads, and a large one loads faster (a
    100 MB ResNet-50 serializes and loads in 0.08 s against 0.21 s, a gigabyte in 3 s
    against 7-11 s: neither protobuf nor onnxruntime parses the weights)."""
    held = [t for t in model.graph.initializer if tensor_bytes(t) >= HELD_MIN
            and t.data_location != onnx.TensorProto.EXTERNAL
            and t.data_type != onnx.TensorProto.STRING]  # text is never external data
    if sum(tensor_bytes(t) for t in held) < HOLD_FROM and not too_large(model):
        return model.SerializeToString(), {}
    blob = np.empty(sum(tensor_bytes(t) for t in held), np.uint8)
    at: dict[str, tuple[int, int]] = {}
    offset = 0
    for init in held:
        data = np.frombuffer(init.raw_data or numpy_helper.to_array(init).tobytes(), np.uint8)
        blob[offset:offset + data.size] = data
        at[init.name] = (offset, data.size)
        offset += data.size

    def outside(init: onnx.TensorProto) -> onnx.TensorProto:
        return init if init.name not in at else pointed(typed_only(init), location,
                                                         *at[init.name])

    return shell(model, outside, HELD_MIN).SerializeToString(), {location: blob}


def save(model: onnx.ModelProto, path: str | Path) -> bool:
    """Write the model; past 2 GB its weights go to `PATH.data` beside it (onnx.save would
    move them out of `model` itself). Whether they did: what onnxruntime's tools are then
    told (`use_external_data_format`)."""
    path = Path(path)
    if not too_large(model):
        onnx.save(model, str(path))
        return False
    data, held = serialized(model, f"{path.name}.data")
    path.write_bytes(data)
    held[f"{path.name}.data"].tofile(path.with_name(f"{path.name}.data"))
    return True
