"""Sub-models: each partition extracted, run on onnxruntime in plan order, equals the whole."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from runtime.cost import CostModel
from runtime.devices.ort import sessions as ort_helpers
from runtime.devices.ort.sessions import (
    cpu_session,
    same_ops,
    supported_ir_version,
    supported_opset,
)
from runtime.devices.spec import parse_devices
from runtime.errors import PartitionError, ProvisionError
from runtime.graph import Graph, load_graph, subgraphs
from runtime.partition import Partition, partition
from runtime.partition.build import build_plan
from runtime.partition.submodel import extract
from runtime.stored import with_weights
from tests.support.dags import SAMPLE_NAMES, SAMPLES_DIR, sample_graph

BATCH = 2


def random_feeds(graph: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for name in graph.inputs:
        info = graph.tensors[name]
        shape = [d if isinstance(d, int) else BATCH for d in info.dims]
        feeds[name] = rng.standard_normal(shape).astype(info.dtype)
    return feeds


@functools.cache
def whole_session(name: str) -> ort.InferenceSession:
    return ort.InferenceSession(with_weights(sample_graph(name).model).SerializeToString(),
                                providers=["CPUExecutionProvider"])


def run_partitions(graph: Graph, parts: Sequence[Partition], feeds: dict[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
    values = dict(feeds)
    for part in parts:
        model = extract(graph, part)
        onnx.checker.check_model(with_weights(model))  # its weights read from the file
        outs = cpu_session(model).run(list(part.outputs), {t: values[t] for t in part.inputs})
        values.update(zip(part.outputs, outs, strict=True))
    return values


def assert_matches_whole(name: str, parts: Sequence[Partition], feeds: dict[str, np.ndarray]
                         ) -> None:
    graph = sample_graph(name)
    values = run_partitions(graph, parts, feeds)
    expected = whole_session(name).run(graph.outputs, feeds)
    for out, want in zip(graph.outputs, expected, strict=True):
        np.testing.assert_allclose(values[out], want, rtol=1e-4, atol=1e-5, err_msg=out)


def cut(graph: Graph, k: int) -> list[Partition]:
    """Two partitions split at position k of the model order."""
    order = [n.name for n in graph.nodes]
    devices = parse_devices("cpu:2")
    groups = [("a", "cpu0", order[:k]), ("b", "cpu1", order[k:])]
    return build_plan(graph, CostModel.roofline(graph), devices, groups, mode="user",
                      order=order).partitions


@pytest.mark.parametrize("mode", ["memory", "balanced"])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_partitions_match_whole_model(name: str, count: int, mode: str) -> None:
    graph = sample_graph(name)
    plan = partition(graph, parse_devices(f"cpu:{count}"), mode)
    feeds = random_feeds(graph, np.random.default_rng())
    assert_matches_whole(name, plan.partitions, feeds)
    if name == "control_flow":  # the other branch of the If
        assert_matches_whole(name, plan.partitions, {k: -v for k, v in feeds.items()})
    for part in plan.partitions:
        model = extract(graph, part)
        assert model.graph.name == f"{graph.name}/{part.name}"
        for value in model.graph.input:
            assert value.type.tensor_type.shape.dim[0].dim_param == "batch", value.name


@pytest.mark.parametrize("name", ["mlp", "control_flow"])
def test_every_two_way_cut_matches(name: str) -> None:
    graph = sample_graph(name)
    feeds = random_feeds(graph, np.random.default_rng())
    for k in range(1, len(graph.nodes)):
        assert_matches_whole(name, cut(graph, k), feeds)
        assert_matches_whole(name, cut(graph, k), {t: -v for t, v in feeds.items()})


def if_outer_weights(graph: Graph) -> set[str]:
    proto = next(n for n in graph.model.graph.node if n.op_type == "If")
    inner = {t for g in subgraphs(proto) for n in g.node for t in n.input}
    return inner & set(graph.initializers)


def test_if_partition_carries_outer_scope() -> None:
    graph = sample_graph("control_flow")
    if_node = next(n for n in graph.nodes if n.op_type == "If")
    [h] = [t for t in if_node.outer_inputs if not graph.is_weight(t)]  # `h` in the README
    assert if_outer_weights(graph)
    plans = [partition(graph, parse_devices(f"cpu:{k}"), m)
             for k in (1, 2, 3, 4) for m in ("memory", "balanced")]
    cuts = [cut(graph, k) for k in range(1, len(graph.nodes))]
    split = 0
    for parts in [p.partitions for p in plans] + cuts:
        part = next(p for p in parts if if_node.name in p.nodes)
        model = extract(graph, part)
        assert if_outer_weights(graph) <= {t.name for t in model.graph.initializer}
        assert h in part.inputs or graph.producer[h] in part.nodes
        if h in part.inputs:
            split += 1
            value = next(v for v in model.graph.input if v.name == h)
            assert value.type.tensor_type.shape.dim[0].dim_param == "batch"
    assert split, f"no plan put the If apart from the producer of {h}"


def test_newer_ir_version_is_restamped() -> None:
    model = onnx.load(str(SAMPLES_DIR / "mlp.onnx"))
    model.ir_version = onnx.IR_VERSION
    graph = load_graph(model)
    parts = partition(graph, parse_devices("cpu:2"), "balanced").partitions
    for part in parts:
        sub = extract(graph, part)
        assert sub.ir_version == min(onnx.IR_VERSION, supported_ir_version())
        onnx.checker.check_model(sub)
        cpu_session(sub)
    assert 7 <= supported_ir_version() <= onnx.IR_VERSION
    assert 7 <= supported_opset() <= onnx.defs.onnx_opset_version()


def tiny_model(op: str, opset: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    attrs = {"to": TensorProto.FLOAT} if op == "Cast" else {}
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node(op, ["r"], ["y"], name="op", **attrs)]
    model = helper.make_model(helper.make_graph(nodes, "tiny", [x], [y]),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = onnx.IR_VERSION
    return model


def test_newer_opset_is_restamped_only_when_sound(monkeypatch) -> None:
    newest, low = onnx.defs.onnx_opset_version(), supported_opset()
    pretend = newest <= low
    if pretend:
        # This onnxruntime reads onnx's newest opset: pretend it stops just before Cast's
        # last change, so one op must keep the new opset and one (Sigmoid) can drop it.
        low = onnx.defs.get_schema("Cast", newest).since_version - 1
        monkeypatch.setattr(ort_helpers, "supported_opset", lambda: low)
    for op in ("Sigmoid", "Cast"):
        graph = load_graph(tiny_model(op, newest))
        devices, names = parse_devices("cpu:1"), [n.name for n in graph.nodes]
        [part] = build_plan(graph, CostModel.roofline(graph), devices, [("p0", "cpu0", names)],
                            mode="user", order=names).partitions
        sub = extract(graph, part)
        onnx.checker.check_model(sub)
        [stamp] = [o.version for o in sub.opset_import if o.domain in ("", "ai.onnx")]
        if same_ops(["Relu", op], newest, low):
            assert stamp == low
            x = np.random.default_rng().standard_normal((BATCH, 4)).astype(np.float32)
            [y] = cpu_session(sub).run(None, {"x": x})
            want = np.maximum(x, 0)
            np.testing.assert_allclose(y, 1 / (1 + np.exp(-want)) if op == "Sigmoid" else want,
                                       rtol=1e-5)
        else:
            assert stamp == newest
            if not pretend:  # only a real onnxruntime refuses the newer opset
                with pytest.raises(ProvisionError, match="tiny/p0") as info:
                    cpu_session(sub)
                assert "\n" not in str(info.value)
            # placement sees it first: no plan puts the op on onnxruntime
            with pytest.raises(PartitionError, match=f"{op}.*re-stamped"):
                partition(graph, devices, "memory")


def test_input_without_type_is_an_error() -> None:
    graph = load_graph(SAMPLES_DIR / "mlp.onnx")
    parts = cut(graph, 3)
    [inner] = parts[1].inputs
    del graph.types[inner]
    with pytest.raises(ProvisionError, match=f"{parts[1].name}.*{inner}"):
        extract(graph, parts[1])
    graph.types.pop(parts[0].outputs[0], None)
    assert not extract(graph, parts[0]).graph.output[0].type.WhichOneof("value")
