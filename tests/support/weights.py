"""Small models about weights: one weight two partitions read, weights behind
`Identity` and `Constant` nodes as PyTorch's legacy exporter leaves them, and weights
made by nodes the fold's bound keeps (`made_weights`).

    model = shared_weight_chain()          # x -> MatMul(w) -> Relu -> MatMul(w) -> y
    plan = host.add_network("s", model, partition=SHARED_MAP)   # the two MatMuls apart
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH = 32  # the shared weight is WIDTH x WIDTH float32: 4 KiB, stored externally in bundles
SHARED_MAP = {"partitions": {"p0": "cpu0", "p1": "cpu1"},
              "nodes": {"first": "p0", "relu": "p0", "second": "p1"}}


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], name: str
           ) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])
    graph = helper.make_graph(nodes, name, [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def shared_weight_chain(seed: int = 0) -> onnx.ModelProto:
    """x -> MatMul(w) -> Relu -> MatMul(w) -> y: both MatMuls read the one weight `w`."""
    w = np.random.default_rng(seed).standard_normal((WIDTH, WIDTH)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="first"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w"], ["y"], name="second")]
    return _model(nodes, [numpy_helper.from_array(w, "w")], "shared")


def identity_weights_chain(seed: int = 0) -> onnx.ModelProto:
    """x -> MatMul(Identity(w1)) -> Add(Identity(b)) -> Reshape(Constant shape) -> Relu ->
    MatMul(Transpose(w2)) -> y: every weight reaches its reader through a node over
    constants, as the legacy exporter writes them."""
    rng = np.random.default_rng(seed)
    w1, w2 = (rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal(WIDTH).astype(np.float32)
    shape = numpy_helper.from_array(np.array([-1, WIDTH], np.int64))
    nodes = [helper.make_node("Identity", ["w1"], ["w1_id"], name="w1_identity"),
             helper.make_node("Identity", ["b"], ["b_id"], name="b_identity"),
             helper.make_node("Constant", [], ["shape"], name="shape_constant", value=shape),
             helper.make_node("Transpose", ["w2"], ["w2_t"], name="w2_transpose"),
             helper.make_node("MatMul", ["x", "w1_id"], ["h"], name="first"),
             helper.make_node("Add", ["h", "b_id"], ["hb"], name="bias"),
             helper.make_node("Reshape", ["hb", "shape"], ["hr"], name="reshape"),
             helper.make_node("Relu", ["hr"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2_t"], ["y"], name="second")]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array(bias, "b")]
    return _model(nodes, inits, "identity_weights")


def feeds(batch: int = 2, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    rng = rng or np.random.default_rng()
    return {"x": rng.standard_normal((batch, WIDTH)).astype(np.float32)}


def made_weights(layers: int, width: int = 256) -> onnx.ModelProto:
    """x @ w0 @ w1 ...: each weight a ConstantOfShape of a tiny shape, all of them first
    in the file and not in the order they are read (as in onnx's light model-zoo models):
    past the fold's bound, so they stay nodes."""
    shape = numpy_helper.from_array(np.array([width, width], np.int64), "shape")
    fills = [helper.make_node("ConstantOfShape", ["shape"], [f"w{i}"], name=f"fill{i}",
                              value=numpy_helper.from_array(np.array([1 / width], np.float32)))
             for i in reversed(range(layers))]
    matmuls = [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"], name=f"mm{i}")
               for i in range(layers)]
    x = helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["N", width])
    y = helper.make_tensor_value_info(f"h{layers}", TensorProto.FLOAT, ["N", width])
    return helper.make_model(helper.make_graph(fills + matmuls, "made", [x], [y], [shape]),
                             opset_imports=[helper.make_opsetid("", 17)])
