"""ONNX's backend test suite through Prism: every CPU test, with models split across devices.

The suite runs through `PrismBackend` with its default devices (two `cpu` devices and a
`reference` fallback). Tests listed in conformance_failures.toml under `[failures]` are
strict expected failures: one that starts passing fails the run until it leaves the list;
those under `[onnxruntime]` fail or pass with onnxruntime's kernels, whichever release is
installed. Every model
prepared here is also checked to be split: two or more nodes the cpu devices can run
mean partitions on both cpu devices.
"""

from __future__ import annotations

import json
import re
import tomllib
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.backend.test
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from runtime.devices import parse_devices
from runtime.devices.ort.sessions import supported_opset
from runtime.errors import InvalidInputError
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds
from runtime.onnx_backend import PrismBackend, PrismRep, default_devices

FAILURES_FILE = Path(__file__).with_name("conformance_failures.toml")
_LISTED = tomllib.loads(FAILURES_FILE.read_text())
FAILURES: dict[str, str] = _LISTED["failures"]  # no runtime passes these: strict
ORT_FAILURES: dict[str, str] = _LISTED["onnxruntime"]  # onnxruntime's values: release-bound
RANDOM: dict[str, str] = _LISTED["random"]  # random draws: may match by chance
CPU = {d.name for d in default_devices() if d.backend == "cpu"}


def assert_split(rep: PrismRep) -> None:
    """Nodes on the cpu devices span both of them whenever there are two or more."""
    on_cpu = [n for p in rep.plan.partitions if p.device in CPU for n in p.nodes]
    used = {p.device for p in rep.plan.partitions if p.device in CPU}
    assert len(on_cpu) < 2 or used == CPU, (
        f"{len(on_cpu)} nodes on cpu devices, but only {sorted(used)} hold partitions")


class SplitCheckedPrism(PrismBackend):
    """PrismBackend, with every prepared model's plan checked for a real split."""

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        rep = super().prepare(model, device, **kwargs)
        assert_split(rep)
        return rep


with warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore")  # the node cases' own numpy warnings while they load
    backend_test = onnx.backend.test.BackendTest(SplitCheckedPrism, __name__)
backend_test.include(r"_cpu$")
for _name in FAILURES:
    backend_test.xfail(rf"^{_name}_cpu$")
for _case in backend_test.test_cases.values():
    for _name, _reason in {**ORT_FAILURES, **RANDOM}.items():
        if hasattr(_case, f"{_name}_cpu"):
            setattr(_case, f"{_name}_cpu", pytest.mark.xfail(reason=_reason, strict=False)(
                getattr(_case, f"{_name}_cpu")))
globals().update(backend_test.test_cases)


@pytest.fixture(autouse=True, scope="module")
def _onnx_home(tmp_path_factory):
    """onnx's Runner writes the `real` light models' data under ONNX_HOME (else ~/.onnx)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ONNX_HOME", str(tmp_path_factory.mktemp("onnx_home")))
    yield
    patch.undo()


def test_failure_list_names_real_tests():
    """A stale or misspelt entry would silently match nothing."""
    known = {name.removesuffix("_cpu") for case in backend_test.test_cases.values()
             for name in dir(case) if name.startswith("test_")}
    listed = {**FAILURES, **ORT_FAILURES, **RANDOM}
    assert sorted(set(listed) - known) == []
    assert all(isinstance(reason, str) and reason.strip() for reason in listed.values())


def _chain(n: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info(f"t{n}", onnx.TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Relu" if i % 2 else "Neg", [f"t{i}" if i else "x"], [f"t{i + 1}"])
             for i in range(n)]
    return helper.make_model(helper.make_graph(nodes, "chain", [x], [y]))


def test_multi_node_model_is_split_across_both_cpu_devices():
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    with PrismBackend.prepare(_chain(4)) as rep:
        devices = [p.device for p in rep.plan.partitions]
        assert set(devices) == CPU and len(rep.plan.partitions) >= 2
        assert rep.plan.transfers and all(t.src != t.dst for t in rep.plan.transfers)
        (y,) = rep.run([x])
    np.testing.assert_array_equal(y, np.maximum(-np.maximum(-x, 0), 0))


def test_one_node_model_runs_on_one_device():
    with PrismBackend.prepare(_chain(1)) as rep:
        assert len(rep.plan.partitions) == 1
        assert rep.run({"x": np.ones((2, 3), np.float32)})[0].tolist() == [[-1.0] * 3] * 2


UNARY_OPS = ("Relu", "Abs", "Neg", "Sign", "Floor", "Sqrt", "Reciprocal", "Exp")
ELEM_TYPES = (TensorProto.UINT16, TensorProto.INT16, TensorProto.UINT32, TensorProto.UINT64,
              TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT16, TensorProto.DOUBLE)


def _unary(op: str, elem: int, opset: int) -> onnx.ModelProto:
    x, y = (helper.make_tensor_value_info(n, elem, [3]) for n in "xy")
    return helper.make_model(helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                                               [x], [y]),
                             opset_imports=[helper.make_opsetid("", opset)])


def ort_cannot_run() -> tuple[str, int]:
    """A unary op on an element type that the installed onnxruntime really cannot run,
    found by trying (a session of the node alone), while the reference evaluator can:
    no onnxruntime release makes this stale, the way a hard-coded opset did."""
    opset = supported_opset()
    for op in UNARY_OPS:
        for elem in ELEM_TYPES:
            model = _unary(op, elem, opset)
            try:
                onnx.checker.check_model(model, full_check=True)
            except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
                continue  # the op's schema does not take this type
            try:
                ort.InferenceSession(model.SerializeToString(),
                                     providers=["CPUExecutionProvider"])
                continue
            except Exception:  # no kernel: what we are looking for
                pass
            x = np.array([0, 1, 4], helper.tensor_dtype_to_np_dtype(elem))
            try:
                ReferenceEvaluator(model).run(None, {"x": x})
            except Exception:
                continue
            return op, elem
    pytest.fail(f"onnxruntime {ort.__version__} runs every one of {UNARY_OPS} on every "
                f"type tried; add a candidate it cannot run")


def test_nodes_onnxruntime_cannot_run_go_to_the_reference_fallback():
    """A node onnxruntime has no kernel for goes to the reference fallback, while the
    float nodes around it run on both cpu devices."""
    op, elem = ort_cannot_run()
    f = TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", f, [3])
    y = helper.make_tensor_value_info("y", f, [3])
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Cast", ["a"], ["b"], to=elem),
             helper.make_node(op, ["b"], ["c"]),
             helper.make_node("Cast", ["c"], ["d"], to=f),
             helper.make_node("Neg", ["d"], ["e"]), helper.make_node("Abs", ["e"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", supported_opset())])
    odd = f"{op}_2"
    with PrismBackend.prepare(model) as rep:
        where = {n: p.device for p in rep.plan.partitions for n in p.nodes}
        assert where.pop(odd) == "reference0"
        assert set(where.values()) == CPU
        assert "fallback reference0" in rep.plan.reasons[odd]
        assert "onnxruntime" in rep.plan.reasons[odd]
        feed = np.random.default_rng().uniform(0, 8, 3).astype(np.float32).round()
        (out,) = rep.run([feed])
    (want,) = ReferenceEvaluator(model).run(None, {"x": feed})
    np.testing.assert_array_equal(out, want)


def test_rep_closes_its_host():
    rep = PrismBackend.prepare(_chain(2))
    rep.close()
    with pytest.raises(Exception, match="closed"):
        rep.run([np.zeros((2, 3), np.float32)])


def test_run_node_types_outputs_by_inference_or_outputs_info():
    node = helper.make_node("Split", ["x"], ["y", "z"], axis=0, num_outputs=2)
    y, z = PrismBackend.run_node(node, [np.arange(4, dtype=np.float32)])
    assert y.tolist() == [0.0, 1.0] and z.tolist() == [2.0, 3.0]
    relu = helper.make_node("Relu", ["x"], ["y"])
    (out,) = PrismBackend.run_node(relu, {"x": np.array([-1.0, 2.0])}, opset_version=14,
                                   outputs_info=[(np.float64, (2,))])
    assert out.dtype == np.float64 and out.tolist() == [0.0, 2.0]


def test_sequences_and_optionals_cross_partitions():
    """A sequence made on one cpu device is read on the other; an empty optional feed."""
    f = onnx.TensorProto.FLOAT
    seq = helper.make_tensor_sequence_value_info("s", f, None)
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceInsert", ["s", "a"], ["t"]),
             helper.make_node("SequenceLength", ["t"], ["n"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"])]
    opt = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(f, [1])))
    model = helper.make_model(helper.make_graph(
        nodes, "seq", [helper.make_tensor_value_info("a", f, [2]),
                       helper.make_tensor_value_info("b", f, [3]), opt],
        [helper.make_tensor_value_info("n", onnx.TensorProto.INT64, []),
         helper.make_tensor_value_info("has", onnx.TensorProto.BOOL, []), seq]),
        opset_imports=[helper.make_opsetid("", 18)])
    with PrismBackend.prepare(model) as rep:
        assert {p.device for p in rep.plan.partitions} == CPU
        a, b = np.ones(2, np.float32), np.zeros(3, np.float32)
        n, has, s = rep.run([a, b, None])
        assert int(n) == 3 and not bool(has) and [x.tolist() for x in s] == [a.tolist(),
                                                                            b.tolist()]
        assert bool(rep.run({"a": a, "b": b, "o": np.ones(1, np.float32)})[1])


def test_a_map_input_is_drawn_checked_and_run():
    """A DictVectorizer reads a map: random feeds (`prism run`, the dashboards' load)
    gave None for it, which onnxruntime took as a missing input."""
    features = helper.make_value_info("features", helper.make_map_type_proto(
        TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    model = helper.make_model(helper.make_graph(
        [helper.make_node("DictVectorizer", ["features"], ["v"], domain="ai.onnx.ml",
                          string_vocabulary=["a", "b", "z"])], "vectorize", [features],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 3])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("vectorize", model)
        feeds = random_feeds(input_specs(host.graph("vectorize")), np.random.default_rng())
        assert set(feeds["features"]) == {"a", "b", "c"}
        np.testing.assert_array_equal(host.infer("vectorize", feeds)["v"],
                                      session.run(None, feeds)[0])
        with pytest.raises(InvalidInputError, match=re.escape(
                "'features' of vectorize: expected map of string to float32 (a dict), got list")):
            host.infer("vectorize", {"features": [1.0]})


def test_prism_conformance_command(capsys):
    from app.cli import main

    code = main(["conformance", "--suite", "simple", "-k", "sequence_model[12]$", "--json",
                 "--timeout", "60"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["runtimes"] == ["prism", "onnxruntime", "reference"]
    [simple, total] = report["suites"]
    assert simple["tests"] == total["tests"] == 2
    assert simple["passed"]["prism"] == 2 and not simple["onnxruntime_not_prism"]
    assert {t["name"] for t in report["tests"]} == {"test_sequence_model1",
                                                    "test_sequence_model2"}
