"""External data held in memory, put back into a model: for what reads a ModelProto whole
(the reference evaluator, export-onnx) rather than handing onnxruntime the files."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx


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
