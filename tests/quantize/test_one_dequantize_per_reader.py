"""A dequantize node read on both sides of a cut: each reader gets its own copy at load, as
onnxruntime gives it before fusing, so the cut passes int8 and every QDQ group is whole
on one device."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from runtime.dequantize import one_reader_each
from runtime.devices import parse_devices
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.partition import partition

WIDTH = 64


def _shared_dequantize(rng: np.random.Generator) -> onnx.ModelProto:
    """x -> Q -> DQ, read by a MatMul group and an Add group, each ending in Q -> DQ."""
    scale = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)  # noqa: E731
    zero = lambda name: numpy_helper.from_array(np.array(128, np.uint8), name)  # noqa: E731
    w = rng.integers(0, 255, (WIDTH, WIDTH), dtype=np.uint8)
    c = rng.integers(0, 255, (WIDTH,), dtype=np.uint8)
    inits = [scale("sx", 0.02), zero("zx"), numpy_helper.from_array(w, "w"), scale("sw", 0.01),
             numpy_helper.from_array(c, "c"), scale("sc", 0.03), scale("sy", 0.05), zero("zy")]
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
             node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
             node("DequantizeLinear", ["w", "sw", "zx"], ["wd"], name="dqw"),
             node("DequantizeLinear", ["c", "sc", "zx"], ["cd"], name="dqc"),
             node("MatMul", ["xd", "wd"], ["m"], name="matmul"),
             node("QuantizeLinear", ["m", "sy", "zy"], ["mq"], name="qm"),
             node("DequantizeLinear", ["mq", "sy", "zy"], ["y1"], name="dqm"),
             node("Add", ["xd", "cd"], ["a"], name="add"),
             node("QuantizeLinear", ["a", "sy", "zy"], ["aq"], name="qa"),
             node("DequantizeLinear", ["aq", "sy", "zy"], ["y2"], name="dqa")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, WIDTH])
    outs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, [None, WIDTH])
            for y in ("y1", "y2")]
    model = helper.make_model(helper.make_graph(nodes, "shared_dq", [x], outs, inits),
                              opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def test_each_reader_of_a_dequantize_node_gets_its_own():
    model = _shared_dequantize(np.random.default_rng())
    assert one_reader_each(model.graph) == 1
    readers = {n.name: list(n.input) for n in model.graph.node}
    assert readers["matmul"][0] == "xd" and readers["add"][0] != "xd"
    twin = next(n for n in model.graph.node if n.output[0] == readers["add"][0])
    assert twin.op_type == "DequantizeLinear" and list(twin.input) == ["xq", "sx", "zx"]
    onnx.checker.check_model(model)
    assert one_reader_each(model.graph) == 0  # every reader has its own now


def test_a_cut_between_the_readers_passes_int8_and_answers_as_onnxruntime():
    rng = np.random.default_rng()
    model = _shared_dequantize(rng)
    graph = load_graph(model)
    mapping = {"default": "a", "partitions": {"a": "cpu0", "b": "cpu1"},
               "nodes": dict.fromkeys(["add", "qa", "dqa"], "b")}
    feeds = {"x": rng.standard_normal((3, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    with HostManager(parse_devices("cpu:2")) as host:
        plan = host.add_network("shared", model, partition=mapping)
        got = host.run("shared", feeds).result(timeout=30)
    crossing = {t.tensor: graph.tensors[t.tensor].dtype for t in plan.transfers}
    assert crossing and set(crossing.values()) == {"uint8"}, crossing
    for name, expected in zip(("y1", "y2"), want, strict=True):
        np.testing.assert_array_equal(got[name], expected)


def test_a_map_naming_every_node_of_the_model_places_the_copies_with_their_readers():
    """A complete map names no copy (they are made at load): each goes with its reader,
    and an unnamed quantize node with its producer."""
    model = _shared_dequantize(np.random.default_rng())
    names = [n.name for n in model.graph.node if n.name != "qa"]
    side = {"add": "b", "dqa": "b"}
    mapping = {"partitions": {"a": "cpu0", "b": "cpu1"},
               "nodes": {n: side.get(n, "a") for n in names}}
    plan = partition(load_graph(model), parse_devices("cpu:2"), "user", user_map=mapping)
    home = {n: p.name for p in plan.partitions for n in p.nodes}
    assert home["dqx/for_add"] == home["qa"] == "b" and home["dqx"] == "a"
