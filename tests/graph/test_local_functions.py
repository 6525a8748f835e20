"""A network exported with its modules as functions (torch's `export_modules_as_functions`)
is one call node at the top, its body calling a function per module. Prism inlines them
at load, as onnxruntime does, so its ops can be split, run by onnx's evaluator and
trained."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from runtime.devices import parse_devices
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.train import TrainConfig, Trainer

RNG = np.random.default_rng()
WIDTH = 6
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("pkg.net", 1),
          helper.make_opsetid("pkg.block", 1)]


def modules_as_functions() -> onnx.ModelProto:
    """x -> Net(x, w0, w1), Net: Block(Block(x, w0), w1), Block: Relu(MatMul(x, w))."""
    block = helper.make_function(
        "pkg.block", "Block", ["x", "w"], ["y"],
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        [helper.make_opsetid("", 17)])
    net = helper.make_function(
        "pkg.net", "Net", ["x", "w0", "w1"], ["y"],
        [helper.make_node("Block", ["x", "w0"], ["h"], domain="pkg.block"),
         helper.make_node("Block", ["h", "w1"], ["y"], domain="pkg.block")], OPSETS)
    weights = [numpy_helper.from_array(RNG.standard_normal((WIDTH, WIDTH)).astype(np.float32),
                                       f"w{i}") for i in range(2)]
    graph = helper.make_graph(
        [helper.make_node("Net", ["x", "w0", "w1"], ["y"], name="net", domain="pkg.net")],
        "modular", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=OPSETS, functions=[block, net])
    onnx.checker.check_model(model)
    return model


def test_the_models_functions_are_inlined_at_load():
    graph = load_graph(modules_as_functions())
    assert not graph.model.functions
    assert [n.op_type for n in graph.nodes] == ["MatMul", "Relu", "MatMul", "Relu"]


def test_a_network_of_functions_runs_split_over_cpu_and_reference_as_onnxruntime():
    model = modules_as_functions()
    x = RNG.standard_normal((3, WIDTH)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    nodes = [n.name for n in load_graph(model).nodes]
    split = {"partitions": {"a": "cpu0", "b": "reference0"},
             "nodes": dict(zip(nodes, "aabb", strict=True))}
    with HostManager(parse_devices("cpu:1,reference:1")) as host:
        plan = host.add_network("modular", model, partition=split)
        assert [p.device for p in plan.partitions] == ["cpu0", "reference0"]
        got = host.run("modular", {"x": x}).result(timeout=60)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_network_of_functions_trains():
    model = modules_as_functions()
    data = {"x": RNG.standard_normal((8, WIDTH)).astype(np.float32)}
    config = TrainConfig(loss="mse", batch_size=4, micro_batches=2)
    with Trainer(model, data, RNG.standard_normal((8, WIDTH)).astype(np.float32),
                 parse_devices("cpu:2"), config) as trainer:
        trainer.run()
        trained = {t.name: numpy_helper.to_array(t)
                   for t in trainer.trained_model().graph.initializer}
    for weight in model.graph.initializer:
        assert not np.array_equal(trained[weight.name], numpy_helper.to_array(weight))
