"""float16 on the cpu backend: onnxruntime runs a float16 node with no float16 CPU kernel
through the float one, casting around it (its InsertCastTransformer), so the probe must
accept such nodes and refuse what that cast does not cover, as a real session does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.run_cmd import tolerance
from runtime import HostManager
from runtime.devices import parse_devices
from runtime.devices.ort.kernels import ort_problem
from runtime.devices.ort.sessions import supported_ir_version, supported_opset
from runtime.graph import load_graph

RNG = np.random.default_rng()
HALF = TensorProto.FLOAT16
WIDTH = 16
# (node, device): three stages, so float16 tensors cross devices twice
STAGES = {"conv": "cpu0", "flat": "cpu0", "gemm": "cpu1", "mm": "cpu1",
          "add": "cpu2", "norm": "cpu2", "soft": "cpu2"}


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    """At the newest opset and IR version the installed onnxruntime reads."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", supported_opset())])
    model.ir_version = supported_ir_version()
    onnx.checker.check_model(model)
    return model


def _half(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float16) / 4, name)


def float16_net() -> onnx.ModelProto:
    """Conv, Flatten, Gemm, MatMul, Add, LayerNormalization, Softmax, all on float16."""
    nodes = [
        helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Flatten", ["c"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["g"], name="gemm"),
        helper.make_node("MatMul", ["g", "mw"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "mb"], ["a"], name="add"),
        helper.make_node("LayerNormalization", ["a", "scale", "bias"], ["n"], name="norm"),
        helper.make_node("Softmax", ["n"], ["y"], name="soft"),
    ]
    weights = [_half("cw", 3, 2, 3, 3), _half("gw", 3 * 4 * 4, WIDTH), _half("gb", WIDTH),
               _half("mw", WIDTH, WIDTH), _half("mb", WIDTH), _half("scale", WIDTH),
               _half("bias", WIDTH)]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", HALF,
                                                                            ["N", 2, 4, 4])],
                              [helper.make_tensor_value_info("y", HALF, ["N", WIDTH])], weights)
    return _model(graph)


def test_a_float16_net_runs_split_over_cpu_devices_as_onnxruntime_runs_it():
    model = float16_net()
    graph = load_graph(model)
    assert {n.name: ort_problem(n, graph) for n in graph.nodes} == dict.fromkeys(STAGES)
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rtol, atol = tolerance(np.dtype(np.float16))
    with HostManager(parse_devices("cpu:3")) as host:
        host.add_network("half", model, partition={"nodes": STAGES})
        assert {p.device for p in host.plan("half").partitions} == {"cpu0", "cpu1", "cpu2"}
        for batch in (1, 3, 5):
            x = RNG.standard_normal((batch, 2, 4, 4)).astype(np.float16)
            got = host.run("half", {"x": x}).result(timeout=60)["y"]
            want = plain.run(["y"], {"x": x})[0]
            assert got.dtype == np.float16 and got.shape == want.shape
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                       rtol=rtol, atol=atol)


def _branch(nodes: list[onnx.NodeProto], kinds: dict[str, int]) -> onnx.GraphProto:
    """A branch computing `y` with `nodes`, declaring the types of what they make (the
    probe's kernel check is all that judges a node in a branch: no session of it alone)."""
    inner = [helper.make_tensor_value_info(name, kind, None) for name, kind in kinds.items()]
    return helper.make_graph(nodes, "branch", [], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [2, 2])], value_info=inner)


def _cast(source: str, target: str, to: int) -> onnx.NodeProto:
    return helper.make_node("Cast", [source], [target], to=to)


# Each: the nodes of an If branch over float inputs a, b [2, 2], made to run on another type
BRANCHES = {
    "float16 MatMul": ([_cast("a", "ah", HALF), _cast("b", "bh", HALF),
                        helper.make_node("MatMul", ["ah", "bh"], ["yh"]),
                        _cast("yh", "y", TensorProto.FLOAT)],
                       {"ah": HALF, "bh": HALF, "yh": HALF}),
    "float16 Softmax": ([_cast("a", "ah", HALF), helper.make_node("Softmax", ["ah"], ["yh"]),
                         _cast("yh", "y", TensorProto.FLOAT)], {"ah": HALF, "yh": HALF}),
    # not cast by onnxruntime: bfloat16
    "bfloat16 MatMul": ([_cast("a", "ah", TensorProto.BFLOAT16),
                         _cast("b", "bh", TensorProto.BFLOAT16),
                         helper.make_node("MatMul", ["ah", "bh"], ["yh"]),
                         _cast("yh", "y", TensorProto.FLOAT)],
                        {"ah": TensorProto.BFLOAT16, "bh": TensorProto.BFLOAT16,
                         "yh": TensorProto.BFLOAT16}),
    # not cast by onnxruntime: it makes float16 but reads none
    "float16 RandomNormal": ([helper.make_node("RandomNormal", [], ["r"], shape=[2, 2],
                                               dtype=HALF),
                              _cast("r", "rf", TensorProto.FLOAT),
                              helper.make_node("Add", ["a", "rf"], ["y"])],
                             {"r": HALF, "rf": TensorProto.FLOAT}),
}


def _if_model(nodes: list[onnx.NodeProto], kinds: dict[str, int]) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
              *(helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in "ab")]
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=_branch(nodes, kinds),
                            else_branch=_branch(nodes, kinds))
    return _model(helper.make_graph([node], "branchy", inputs, [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])]))


def _loads(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


@pytest.mark.parametrize("case", BRANCHES)
def test_the_probe_accepts_in_a_branch_what_onnxruntime_loads(case):
    model = _if_model(*BRANCHES[case])
    graph = load_graph(model, fold=False)
    problem = ort_problem(graph.nodes[0], graph)
    assert (problem is None) == _loads(model), problem
