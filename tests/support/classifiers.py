"""Models as scikit-learn's and the boosting libraries' exporters write them: a classifier
as skl2onnx writes one by default (ai.onnx.ml ops, a label tensor and, through ZipMap, a
sequence of {class: probability} maps, one per row: an output no tensor datatype names),
and a tree ensemble as CatBoost writes one."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

FEATURES, CLASSES = 4, 3


def zipmap_classifier(rng: np.random.Generator, text: bool = False) -> onnx.ModelProto:
    """Scaler -> LinearClassifier (softmax) -> ZipMap, over a symbolic batch; classes
    0, 1, 2, or with `text` "a", "b", "c"."""
    key = TensorProto.STRING if text else TensorProto.INT64
    probabilities = helper.make_value_info("probabilities", helper.make_sequence_type_proto(
        helper.make_map_type_proto(key, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    ml = {"domain": "ai.onnx.ml"}
    labels, zipped = ({"classlabels_strings": list("abc"[:CLASSES])},
                      {"classlabels_strings": list("abc"[:CLASSES])}) if text else \
        ({"classlabels_ints": list(range(CLASSES))}, {"classlabels_int64s": list(range(CLASSES))})
    nodes = [
        helper.make_node("Scaler", ["x"], ["scaled"], name="scaler", offset=[0.5] * FEATURES,
                         scale=rng.uniform(0.5, 2, FEATURES).tolist(), **ml),
        helper.make_node("LinearClassifier", ["scaled"], ["label", "scores"], name="linear",
                         **labels, post_transform="SOFTMAX",
                         coefficients=rng.standard_normal(FEATURES * CLASSES).tolist(),
                         intercepts=rng.standard_normal(CLASSES).tolist(), **ml),
        helper.make_node("ZipMap", ["scores"], ["probabilities"], name="zipmap", **zipped,
                         **ml)]
    graph = helper.make_graph(
        nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            ["N", FEATURES])],
        [helper.make_tensor_value_info("label", key, ["N"]), probabilities])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("ai.onnx.ml", 3)])


def stumps_declared_flat(trees: int, features: int, rng: np.random.Generator) -> onnx.ModelProto:
    """A regressor of `trees` one-split trees as CatBoost exports one: the predictions
    declared [N], made [N, 1] by the ensemble, the model importing ai.onnx.ml alone."""
    ids = np.repeat(np.arange(trees), 3).tolist()
    node = helper.make_node(
        "TreeEnsembleRegressor", ["features"], ["predictions"], domain="ai.onnx.ml",
        n_targets=1, nodes_treeids=ids, nodes_nodeids=[0, 1, 2] * trees,
        nodes_featureids=[int(f) for t in rng.integers(0, features, trees) for f in (t, 0, 0)],
        nodes_values=[float(v) for t in rng.standard_normal(trees) for v in (t, 0, 0)],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"] * trees,
        nodes_truenodeids=[1, 0, 0] * trees, nodes_falsenodeids=[2, 0, 0] * trees,
        target_treeids=np.repeat(np.arange(trees), 2).tolist(), target_nodeids=[1, 2] * trees,
        target_ids=[0] * 2 * trees, target_weights=rng.standard_normal(2 * trees).tolist())
    graph = helper.make_graph(
        [node], "stumps", [helper.make_tensor_value_info("features", TensorProto.FLOAT,
                                                         ["N", features])],
        [helper.make_tensor_value_info("predictions", TensorProto.FLOAT, ["N"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 2)],
                             ir_version=8)
