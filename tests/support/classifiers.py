"""A scikit-learn-style classifier as skl2onnx writes one by default: ai.onnx.ml ops, a
label tensor and, through ZipMap, a sequence of {class: probability} maps, one per row
(an output no tensor datatype names)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

FEATURES, CLASSES = 4, 3


def zipmap_classifier(rng: np.random.Generator) -> onnx.ModelProto:
    """Scaler -> LinearClassifier (softmax) -> ZipMap, over a symbolic batch."""
    probabilities = helper.make_value_info("probabilities", helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64,
                                   helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    ml = {"domain": "ai.onnx.ml"}
    nodes = [
        helper.make_node("Scaler", ["x"], ["scaled"], name="scaler", offset=[0.5] * FEATURES,
                         scale=rng.uniform(0.5, 2, FEATURES).tolist(), **ml),
        helper.make_node("LinearClassifier", ["scaled"], ["label", "scores"], name="linear",
                         classlabels_ints=list(range(CLASSES)), post_transform="SOFTMAX",
                         coefficients=rng.standard_normal(FEATURES * CLASSES).tolist(),
                         intercepts=rng.standard_normal(CLASSES).tolist(), **ml),
        helper.make_node("ZipMap", ["scores"], ["probabilities"], name="zipmap",
                         classlabels_int64s=list(range(CLASSES)), **ml)]
    graph = helper.make_graph(
        nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            ["N", FEATURES])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]), probabilities])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("ai.onnx.ml", 3)])
