"""float16 on the cpu backend: onnxruntime runs a float16 node with no float16 CPU kernel
through the float one, casting around it (its InsertCastTransformer), so the probe must
accept such nodes and refuse what that cast does not cover, as a real session does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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

ROOT = Path(__file__).resolve().parents[2]
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


# A float16 ViT's attention, as Prism cut it: a Transpose of the batch axes feeds a
# MatMul. onnxruntime 1.32 crashes the process making a full-optimization session of such
# a model (options.HALF_DISABLED), so each path runs in an interpreter of its own.
TRANSPOSED_MATMUL = """
import sys, tempfile
import numpy as np, onnx
from onnx import TensorProto as T, helper as h, numpy_helper as nh
from app.run_cmd import tolerance
from runtime.bundle.writer import compile_bundle
from runtime.devices import parse_devices
from runtime.devices.device import Program
from runtime.devices.ort.sessions import cpu_session, supported_ir_version, supported_opset
from runtime.devices.ray.actor import PartitionWorker
from runtime.driver import open_bundle
from runtime.host import HostManager

rng = np.random.default_rng()
w, b = (rng.standard_normal(s).astype(np.float16) / 4 for s in ((8, 16), (16,)))
nodes = [h.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2], name="swap"),
         h.make_node("MatMul", ["t", "w"], ["m"], name="mm"),
         h.make_node("Add", ["m", "b"], ["y"], name="add")]
graph = h.make_graph(nodes, "attention", [h.make_tensor_value_info("x", T.FLOAT16, ["N", 5, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT16, [5, "N", 16])],
                     [nh.from_array(w, "w"), nh.from_array(b, "b")])
model = h.make_model(graph, opset_imports=[h.make_opsetid("", supported_opset())])
model.ir_version = supported_ir_version()
x = rng.standard_normal((3, 5, 8)).astype(np.float16)
want = x.astype(np.float32).transpose(1, 0, 2) @ w.astype(np.float32) + b
rtol, atol = tolerance(np.dtype(np.float16))

def same(y, path):
    assert y.dtype == np.float16, path
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=rtol, atol=atol, err_msg=path)
    print(path, "ran")

path = sys.argv[1]
if path == "session":  # what `prism run --check` compares with
    same(cpu_session(model).run(None, {"x": x})[0], path)
elif path == "host":
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("a", model, partition={"nodes": {"swap": "cpu0", "mm": "cpu0",
                                                          "add": "cpu1"}})
        same(host.run("a", {"x": x}).result(timeout=60)["y"], path)
elif path == "bundle":
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, f"{tmp}/a.onnx")
        bundle = compile_bundle(f"{tmp}/a.onnx", parse_devices("cpu:1"), f"{tmp}/a.prism")
        with open_bundle(bundle.path) as driver:
            same(driver.run({"x": x})["y"], path)
elif path == "ray":
    program = Program.of(model, 0, 0)
    worker = PartitionWorker("ray0", 1, False)  # what a Ray device's actor holds
    assert worker.load("k", program.model, 0.0, program.ops, program.external,
                       program.half) == (None, ["y"])
    status, y = worker.run("k", 1, 0.0, {"x": x}, ())
    assert status[0] is None, status
    same(y, path)
"""


@pytest.mark.parametrize("path", ["session", "host", "bundle", "ray"])
def test_a_float16_transpose_feeding_a_matmul_loads_on_every_path(path):
    done = subprocess.run([sys.executable, "-c", TRANSPOSED_MATMUL, path], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and f"{path} ran" in done.stdout, (
        f"exit {done.returncode}: {done.stderr[-2000:]}")
