"""`kernels.ort_problem`: a node onnxruntime runs in its model is one a cpu device runs,
its kernel found for its types and a session of it alone (the probe) loading."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from runtime import HostManager
from runtime.devices import parse_devices
from runtime.devices.ort.kernels import ort_problem
from runtime.graph import load_graph


def sized_resize_model() -> onnx.ModelProto:
    """x -> Resize to twice its sides, given by `sizes` computed from its shape, beside an
    empty roi and empty scales, typed as onnxruntime's pre-processing types them: an export
    at opset 11 raised to 13, as quantizing does (torchvision's FCN). From 13, onnx's shape
    inference refuses a Resize given both scales and sizes unless it sees the scales are
    empty."""
    settings = [numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
                numpy_helper.from_array(np.zeros(0, np.float32), "scales"),
                numpy_helper.from_array(np.array([1, 1, 2, 2], np.int64), "factor")]
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Mul", ["shape", "factor"], ["sizes"], name="sizes"),
             helper.make_node("Resize", ["x", "roi", "scales", "sizes"], ["y"], name="resize",
                              mode="linear")]
    graph = helper.make_graph(
        nodes, "sized", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], settings,
        value_info=[helper.make_tensor_value_info(t, TensorProto.FLOAT, [0])
                    for t in ("roi", "scales")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_resize_given_empty_scales_beside_its_sizes_runs():
    model = sized_resize_model()
    graph = load_graph(model)
    assert ort_problem(graph.by_name["resize"], graph) is None
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 2, *rng.integers(2, 9, 2))).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("sized", model)
        got = host.run("sized", {"x": x}).result(timeout=60)["y"]
    np.testing.assert_array_equal(got, want)


def test_a_float16_where_between_two_constants_runs():
    """onnxruntime has no float16 kernel for Where before opset 16 and runs one cast to
    float, which only its float16 inputs tell; shape inference leaves the two constants
    untyped, and the node, typed by its condition and float16 output alone, could run on
    no device (GPT-2 at opset 14 through onnxruntime's transformer optimizer, in float16)."""
    rng = np.random.default_rng()
    settings = [numpy_helper.from_array(np.array(v, np.float16), n)
                for n, v in (("low", rng.standard_normal()), ("high", rng.standard_normal()))]
    graph = helper.make_graph(
        [helper.make_node("Where", ["c", "low", "high"], ["y"], name="where")], "picked",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["n"])], settings)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    graph = load_graph(model)
    assert ort_problem(graph.by_name["where"], graph) is None
    c = rng.integers(0, 2, 7).astype(bool)
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("picked", model)
        got = host.run("picked", {"c": c}).result(timeout=60)["y"]
    np.testing.assert_array_equal(got, np.where(c, *(numpy_helper.to_array(t) for t in settings)))
