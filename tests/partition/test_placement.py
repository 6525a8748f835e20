"""Heterogeneous placement: annotations, fallback, copies between devices (issue 4).

After TVM's annotation tests: annotate none, some or all nodes, annotate by op type, fall
back, and fail early (naming the node, its op, what was asked and what could run it) on
placements that cannot be honoured. Then: the order devices are listed in never changes a
plan; transfers match a count made here from the definitions; a sim accelerator with a
few ops plus a cpu fallback computes what plain onnxruntime computes.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from app.cli import main
from runtime import HostManager
from runtime.cost import link_seconds, transfer_seconds
from runtime.devices import DeviceConfig
from runtime.devices.ort.sessions import cpu_session, loadable
from runtime.errors import PartitionError
from runtime.graph import Graph, load_graph
from runtime.inputs import input_specs, random_feeds
from runtime.partition import Plan, partition, partition_steps
from runtime.partition.placement import can_run, place, read_annotations
from runtime.partition.regions import placement_order
from runtime.units import human_bytes
from tests.support.dags import (
    SAMPLE_NAMES,
    SAMPLES_DIR,
    Rand,
    biggest_node,
    consumer_names,
    dag_models,
    matmul_chain,
    producers,
    random_dag_model,
    random_devices,
    sample_graph,
    total_bytes,
)

MODES = ("memory", "balanced")
NPU_OPS = frozenset({"Conv", "Gemm", "MatMul", "Relu", "Add"})
WIDTH = 64


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")  # rich must not wrap the lines we read


# --------------------------------------------------------------------------------------
# small hand-built graphs
# --------------------------------------------------------------------------------------
def make_model(nodes: list[tuple[str, str, list[str], list[str]]], outputs: list[str], *,
               width: int = WIDTH, weights: dict[str, tuple[int, ...]] | None = None
               ) -> onnx.ModelProto:
    """(name, op, inputs, outputs) nodes over [1, width] float tensors; input `x`."""
    inits = [numpy_helper.from_array(np.full(shape, 0.01, np.float32), name)
             for name, shape in (weights or {}).items()]
    made = [helper.make_node(op, ins, outs, name=name, **({"axis": -1} if op == "Softmax"
                                                          else {}))
            for name, op, ins, outs in nodes]
    graph = helper.make_graph(
        made, "handmade", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, width]) for t in outputs],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def chain_graph() -> Graph:
    """x -> mm (MatMul) -> relu -> sm (Softmax) -> add (+bias) -> tanh -> y."""
    return load_graph(make_model(
        [("mm", "MatMul", ["x", "W"], ["a"]), ("relu", "Relu", ["a"], ["b"]),
         ("sm", "Softmax", ["b"], ["c"]), ("add", "Add", ["c", "bias"], ["d"]),
         ("tanh", "Tanh", ["d"], ["y"])], ["y"],
        weights={"W": (WIDTH, WIDTH), "bias": (WIDTH,)}), name="chain")


def npu(name: str = "npu0", ops=frozenset({"MatMul", "Relu", "Add"}), **kw) -> DeviceConfig:
    return DeviceConfig(name=name, backend="sim", supported_ops=frozenset(ops), **kw)


def cpu(name: str = "cpu0", **kw) -> DeviceConfig:
    return DeviceConfig(name=name, backend="cpu", **kw)


def device_of(plan: Plan, node: str) -> str:
    return plan.partition_of(node).device


def placed(plan: Plan) -> dict[str, str]:
    return {n: p.device for p in plan.partitions for n in p.nodes}


# --------------------------------------------------------------------------------------
# annotate none, some, all; by op type; fallback
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_no_annotations_every_node_goes_to_a_capable_device_as_cheapest(mode):
    graph = chain_graph()
    devices = [npu(), cpu()]
    plan = partition(graph, devices, mode)
    for node in graph.nodes:
        assert plan.reasons[node.name].startswith("cheapest"), plan.reasons[node.name]
        assert can_run(plan.device(device_of(plan, node.name)), node)
    assert device_of(plan, "sm") == "cpu0" and device_of(plan, "tanh") == "cpu0"
    # the reason says where the mode put it
    part = plan.partition_of("mm")
    assert f"in {part.name} on {part.device}" in plan.reasons["mm"]


@pytest.mark.parametrize("mode", MODES)
def test_annotate_some_nodes_by_name(mode):
    graph = chain_graph()
    plan = partition(graph, [npu(), cpu()], mode, annotations={"nodes": {"relu": "cpu0",
                                                                        "mm": "npu0"}})
    assert device_of(plan, "relu") == "cpu0" and device_of(plan, "mm") == "npu0"
    assert "annotated" in plan.reasons["relu"] and "annotated" in plan.reasons["mm"]
    assert "cpu0" in plan.reasons["relu"]
    for other in ("sm", "add", "tanh"):
        assert plan.reasons[other].startswith("cheapest")


@pytest.mark.parametrize("mode", MODES)
def test_annotate_all_nodes_by_name(mode):
    graph = chain_graph()
    want = {"mm": "npu0", "relu": "cpu0", "sm": "cpu0", "add": "npu0", "tanh": "cpu0"}
    plan = partition(graph, [cpu(), npu()], mode, annotations={"nodes": want})
    assert placed(plan) == want
    assert all("annotated" in plan.reasons[n] for n in want)
    # npu0 -> cpu0 -> npu0 -> cpu0: four copies of one [1, 64] float tensor each
    assert [(t.tensor, t.src, t.dst) for t in plan.transfers] == [
        ("a", "npu0", "cpu0"), ("c", "cpu0", "npu0"), ("d", "npu0", "cpu0")]
    assert all(t.bytes == 4 * WIDTH for t in plan.transfers)


@pytest.mark.parametrize("mode", MODES)
def test_annotate_by_op_type_names_a_device_or_a_kind(mode):
    graph = chain_graph()
    devices = [cpu("cpu0"), cpu("cpu1"), npu("npu0"), npu("npu1")]
    plan = partition(graph, devices, mode, annotations={
        "ops": {"MatMul": "npu1", "Add": "sim", "Relu": "cpu"}})
    assert device_of(plan, "mm") == "npu1"
    assert device_of(plan, "add") in {"npu0", "npu1"}
    assert device_of(plan, "relu") in {"cpu0", "cpu1"}
    assert "annotated npu1 (op MatMul)" in plan.reasons["mm"]
    assert "annotated sim (op Add)" in plan.reasons["add"]
    assert "annotated cpu (op Relu)" in plan.reasons["relu"]


@pytest.mark.parametrize("mode", MODES)
def test_a_node_annotation_beats_an_op_annotation(mode):
    graph = chain_graph()
    plan = partition(graph, [npu(), cpu()], mode,
                     annotations={"ops": {"MatMul": "npu0"}, "nodes": {"mm": "cpu0"}})
    assert device_of(plan, "mm") == "cpu0"
    assert "(node)" in plan.reasons["mm"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["keyword", "table", "both"])
def test_fallback_takes_what_the_annotated_device_cannot_run(mode, how):
    graph = chain_graph()
    notes = {"ops": {op: "npu0" for op in ("MatMul", "Relu", "Softmax", "Add", "Tanh")}}
    kwargs = {}
    if how in ("table", "both"):
        notes["fallback"] = "cpu0" if how == "table" else "npu0"  # the keyword overrides it
    if how in ("keyword", "both"):
        kwargs["fallback"] = "cpu0"
    plan = partition(graph, [npu(), cpu()], mode, annotations=notes, **kwargs)
    assert placed(plan) == {"mm": "npu0", "relu": "npu0", "sm": "cpu0", "add": "npu0",
                            "tanh": "cpu0"}
    for node in ("sm", "tanh"):
        assert "unsupported on npu0 -> fallback cpu0" in plan.reasons[node]
    for node in ("mm", "relu", "add"):
        assert "annotated" in plan.reasons[node] and "fallback" not in plan.reasons[node]


def test_fallback_alone_changes_nothing_a_capable_device_can_take():
    graph = chain_graph()
    plan = partition(graph, [npu(), cpu()], "balanced", fallback="cpu0")
    assert all(r.startswith("cheapest") for r in plan.reasons.values())


def test_a_node_annotated_to_an_unsupporting_device_falls_back():
    graph = chain_graph()
    plan = partition(graph, [npu(), cpu()], "balanced", annotations={
        "nodes": {"sm": "npu0"}, "fallback": "cpu0"})
    assert device_of(plan, "sm") == "cpu0"
    assert "unsupported on npu0 -> fallback cpu0" in plan.reasons["sm"]


def test_annotations_from_a_toml_file(tmp_path):
    path = tmp_path / "ann.toml"
    path.write_text('fallback = "cpu0"\n[nodes]\nrelu = "cpu0"\n[ops]\nSoftmax = "npu0"\n'
                    'MatMul = "sim"\n')
    plan = partition(chain_graph(), [npu(), cpu()], "balanced", annotations=path)
    assert device_of(plan, "relu") == "cpu0" and device_of(plan, "mm") == "npu0"
    assert "fallback cpu0" in plan.reasons["sm"] and device_of(plan, "sm") == "cpu0"


@pytest.mark.parametrize("mode", MODES)
def test_a_flat_map_names_nodes_and_op_types_a_node_first(mode, tmp_path):
    """TVM's form, {op or node: device}: each key is looked up as a node, then an op type."""
    graph = load_graph(make_model(
        [("mm", "MatMul", ["x", "W"], ["a"]), ("Relu", "Relu", ["a"], ["b"]),
         ("r2", "Relu", ["b"], ["c"]), ("tanh", "Tanh", ["c"], ["y"])], ["y"],
        weights={"W": (WIDTH, WIDTH)}), name="flat")
    devices = [npu(), cpu()]
    toml = tmp_path / "flat.toml"
    toml.write_text('MatMul = "npu0"\nRelu = "cpu0"\nr2 = "npu0"\n')
    for notes in ({"MatMul": "npu0", "Relu": "cpu0", "r2": "npu0"}, toml):
        plan = partition(graph, devices, mode, annotations=notes)
        assert placed(plan) | {"tanh": "-"} == {"mm": "npu0", "Relu": "cpu0", "r2": "npu0",
                                                 "tanh": "-"}
        assert plan.reasons["mm"].startswith("annotated npu0 (op MatMul)")
        assert plan.reasons["Relu"].startswith("annotated cpu0 (node)")
    with pytest.raises(PartitionError, match=r"neither a node nor an op type of flat: Conv, mn"):
        partition(graph, devices, mode, annotations={"mn": "cpu0", "Conv": "npu0"})
    toml.write_text('mn = "cpu0"\n')
    with pytest.raises(PartitionError, match=f"annotations {re.escape(str(toml))} name neither"):
        partition(graph, devices, mode, annotations=toml)


def test_placement_steps_come_first_and_carry_each_reason():
    graph = chain_graph()
    steps = list(partition_steps(graph, [npu(), cpu()], "balanced",
                                 annotations={"ops": {"Softmax": "npu0"}}, fallback="cpu0"))
    place = steps[:len(graph.nodes)]
    assert [s.kind for s in place] == ["place"] * len(graph.nodes)
    assert [s.nodes for s in place] == [(n.name,) for n in graph.nodes]
    sm = next(s for s in place if s.nodes == ("sm",))
    assert "unsupported on npu0 -> fallback cpu0" in sm.reason and sm.reason.endswith("cpu0")


def test_host_publishes_placement_reasons_in_partition_steps():
    graph = chain_graph()
    with HostManager([npu(), cpu()]) as host:
        sub = host.bus.subscribe()
        host.add_network("chain", graph.model, annotations={"ops": {"Softmax": "npu0"}},
                         fallback="cpu0")
        events = [e for e in sub.drain() if e.kind == "partition.step"]
        assert host.plan("chain").reasons["sm"].startswith("unsupported on npu0")
    placing = [e.fields["reason"] for e in events if e.fields["step"] == "place"]
    assert len(placing) == len(graph.nodes)
    assert any("fallback cpu0" in r for r in placing)


# --------------------------------------------------------------------------------------
# placements that cannot be honoured fail early and say why
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [*MODES, "user"])
def test_an_op_no_device_can_run(mode):
    graph = chain_graph()
    kw = {"user_map": {"default": "npu0"}} if mode == "user" else {}
    with pytest.raises(PartitionError) as err:
        partition(graph, [npu("npu0"), npu("npu1")], mode, **kw)
    message = str(err.value)
    assert "sm" in message and "Softmax" in message
    assert "devices that can: none" in message
    assert "\n" not in message


def _if_over_softmax() -> onnx.ModelProto:
    """x -> relu -> If(sum(x) > 0: Softmax(r) else Add(r, r)) -> y: the If's branches run
    a Softmax, which the npu lacks, though it lists If."""
    vec = [1, WIDTH]

    def branch(name: str, node: onnx.NodeProto) -> onnx.GraphProto:
        return helper.make_graph([node], name, [], [
            helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, vec)])

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch(
                 "then", helper.make_node("Softmax", ["r"], ["t"], name="soft", axis=-1)),
                 else_branch=branch("else", helper.make_node("Add", ["r", "r"], ["e"],
                                                             name="twice")))]
    graph = helper.make_graph(nodes, "if_softmax", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, vec)], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, vec)],
        initializer=[numpy_helper.from_array(np.zeros((), np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("mode", MODES)
def test_a_control_flow_node_runs_where_every_op_of_its_body_can(mode):
    graph = load_graph(_if_over_softmax())
    ops = {"Relu", "ReduceSum", "Greater", "If", "Add"}
    assert not can_run(npu(ops=ops), graph.node("if"), graph)
    assert can_run(npu(ops=ops | {"Softmax"}), graph.node("if"), graph)
    plan = partition(graph, [npu(ops=ops), cpu()], mode, annotations={"ops": {"If": "npu0"}},
                     fallback="cpu0")
    assert device_of(plan, "if") == "cpu0"
    assert "its body runs Softmax, which is not in the device's op list" in plan.reasons["if"]
    with pytest.raises(PartitionError, match=r"if \(If\) cannot run on npu0: its body runs "
                                             r"Softmax"):
        partition(graph, [npu(ops=ops), cpu()], mode, annotations={"nodes": {"if": "npu0"}})


@pytest.mark.parametrize("mode", MODES)
def test_an_annotation_naming_a_device_that_cannot_run_the_op(mode):
    graph = chain_graph()
    devices = [cpu("cpu0"), npu("npu0"), cpu("cpu1")]
    with pytest.raises(PartitionError) as err:
        partition(graph, devices, mode, annotations={"nodes": {"sm": "npu0"}})
    message = str(err.value)
    assert re.search(r"\bsm\b", message) and "Softmax" in message
    assert "npu0" in message  # the device asked for
    could = message.split("devices that can:")[1]
    assert set(re.findall(r"\w+", could)) == {"cpu0", "cpu1"}
    # by op type, too, and with a fallback that cannot run it either
    with pytest.raises(PartitionError, match=r"Softmax.*npu0.*devices that can: cpu"):
        partition(graph, devices, mode, annotations={"ops": {"Softmax": "npu0"}})
    with pytest.raises(PartitionError, match=r"sm \(Softmax\).*npu0"):
        partition(graph, [npu("npu0"), npu("npu1"), cpu()], mode,
                  annotations={"ops": {"Softmax": "npu0"}}, fallback="npu1")


@pytest.mark.parametrize("notes, needle", [
    ({"nodes": {"mm": "gpu0"}}, "annotation for node mm names 'gpu0', which is not a device"),
    ({"ops": {"MatMul": "tpu"}}, "annotation for op MatMul names 'tpu', which is not a device"),
    ({"ops": {"MatMul": "reference"}}, "names 'reference', which is"),
    ({"nodes": {"nope": "cpu0"}}, "annotations name nodes not in chain: nope"),
    ({"devices": {"mm": "cpu0"}}, "unknown key"),
])
def test_annotation_errors(notes, needle):
    with pytest.raises(PartitionError) as err:
        partition(chain_graph(), [npu(), cpu()], "balanced", annotations=notes)
    message = str(err.value)
    assert needle in message, message
    if "which is" in needle:
        assert "npu0" in message and "cpu0" in message  # lists the devices there are
    if "reference" in needle:
        assert "kind with no device here" in message


def test_a_fallback_that_is_not_a_device():
    for fallback in ("gpu0", "cpu"):  # a kind is not a fallback device
        with pytest.raises(PartitionError, match=f"fallback device '{fallback}' is not among"):
            partition(chain_graph(), [npu(), cpu()], "balanced", fallback=fallback)


def test_a_user_map_against_an_annotation_is_rejected():
    with pytest.raises(PartitionError, match=r"cpu0 cannot run mm .*allowed: npu0"):
        partition(chain_graph(), [npu(), cpu()], "user", annotations={"nodes": {"mm": "npu0"}},
                  user_map={"default": "cpu0"})


def test_error_messages_do_not_depend_on_device_order():
    graph = chain_graph()
    devices = [cpu("cpu0"), npu("npu0"), cpu("cpu1")]
    messages = set()
    for listing in (devices, devices[::-1]):
        with pytest.raises(PartitionError) as err:
            partition(graph, listing, "balanced", annotations={"nodes": {"sm": "npu0"}})
        messages.add(str(err.value))
    assert len(messages) == 1, messages


def test_reasons_do_not_depend_on_device_order():
    graph = chain_graph()
    devices = [npu("npu0"), npu("npu1"), cpu("cpu0")]
    reasons = [partition(graph, listing, "balanced", annotations={"ops": {"Softmax": "sim"}},
                         fallback="cpu0").reasons["sm"] for listing in (devices, devices[::-1])]
    assert reasons[0] == reasons[1]


# --------------------------------------------------------------------------------------
# the order devices are listed in (or their names) never changes a plan
# --------------------------------------------------------------------------------------
def capability(device: DeviceConfig) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in device.to_dict().items() if k != "name"))


def random_annotations(r: Rand, graph: Graph, devices: list[DeviceConfig]) -> dict:
    names = [d.name for d in devices]
    kinds = sorted({d.backend for d in devices})
    ops = sorted({n.op_type for n in graph.nodes})
    notes: dict = {"ops": {}, "nodes": {}}
    for op in ops:
        if r.chance(0.4):
            notes["ops"][op] = r.choice(names + kinds)
    for node in graph.nodes:
        if r.chance(0.1):
            notes["nodes"][node.name] = r.choice(names)
    anything = [d.name for d in devices if d.supported_ops is None]
    if anything and r.chance(0.7):
        notes["fallback"] = r.choice(anything)
    return notes


def reason_kind(reason: str) -> str:
    return next(k for k in ("fallback", "annotated", "cheapest") if k in reason)


def plan_or_error(graph, devices, mode, notes):
    try:
        return partition(graph, devices, mode, annotations=notes)
    except PartitionError as exc:
        return exc


def shape_of(plan: Plan, devices: list[DeviceConfig]) -> list:
    caps = {d.name: capability(d) for d in devices}
    return [(p.nodes, caps[p.device]) for p in plan.partitions]


def strip_detail(reasons: dict[str, str]) -> dict[str, str]:
    return {n: re.sub(r" \([\w.-]+ does not list [\w.]+\)", "", r) for n, r in reasons.items()}


def check_listing_invariance(graph: Graph, devices: list[DeviceConfig], r: Rand) -> None:
    notes = random_annotations(r, graph, devices)
    shuffled = r.shuffled(devices)
    rename = dict(zip([d.name for d in devices],
                      r.shuffled([f"dev{i}" for i in range(len(devices))]), strict=True))
    renamed = r.shuffled([d.with_name(rename[d.name]) for d in devices])
    renamed_notes = {
        "ops": {op: rename.get(v, v) for op, v in notes["ops"].items()},
        "nodes": {n: rename[v] for n, v in notes["nodes"].items()},
        **({"fallback": rename[notes["fallback"]]} if "fallback" in notes else {})}
    for mode in MODES:
        plan = plan_or_error(graph, devices, mode, notes)
        other = plan_or_error(graph, shuffled, mode, notes)
        third = plan_or_error(graph, renamed, mode, renamed_notes)
        if isinstance(plan, PartitionError):
            assert isinstance(other, PartitionError) and isinstance(third, PartitionError)
            # the same failure, up to the order device names are listed in it
            words = [sorted(re.findall(r"[\w/.-]+", str(e))) for e in (plan, other)]
            assert words[0] == words[1], (plan, other)
            continue
        assert not isinstance(other, PartitionError), other
        assert not isinstance(third, PartitionError), third
        # listed in another order: the very same plan
        assert [(p.nodes, p.device) for p in plan.partitions] == \
               [(p.nodes, p.device) for p in other.partitions]
        assert plan.bottleneck_seconds == other.bottleneck_seconds
        # (the "(npuX does not list Op)" detail is checked in
        # test_reasons_do_not_depend_on_device_order)
        assert strip_detail(plan.reasons) == strip_detail(other.reasons)
        assert [(t.tensor, t.src, t.dst, t.bytes) for t in plan.transfers] == \
               [(t.tensor, t.src, t.dst, t.bytes) for t in other.transfers]
        # renamed: the same node groups on devices with the same figures
        assert shape_of(plan, devices) == shape_of(third, renamed)
        assert plan.bottleneck_seconds == third.bottleneck_seconds
        assert {n: reason_kind(x) for n, x in plan.reasons.items()} == \
               {n: reason_kind(x) for n, x in third.reasons.items()}
        for n in notes["nodes"]:  # a node annotation names exactly one device
            assert rename[device_of(plan, n)] == device_of(third, n)


@settings(max_examples=25)
@given(data=st.data())
def test_device_listing_never_changes_the_plan(data):
    if data.draw(st.booleans()):
        graph = load_graph(data.draw(dag_models(5, 30)))
    else:
        graph = sample_graph(data.draw(st.sampled_from(SAMPLE_NAMES)))
    r = Rand(data.draw)
    ops = sorted({n.op_type for n in graph.nodes})
    devices = random_devices(r, total_bytes(graph), min_devices=2, max_devices=6, ops=ops,
                             floor=biggest_node(graph))
    check_listing_invariance(graph, devices, r)


@pytest.mark.parametrize("mode", MODES)
def test_renaming_an_annotated_twin_only_renames(mode):
    graph = sample_graph("mlp")
    plan = partition(graph, [cpu("cpu0"), cpu("cpu1")], mode,
                     annotations={"ops": {"Relu": "cpu1"}})
    renamed = partition(graph, [cpu("b"), cpu("a")], mode, annotations={"ops": {"Relu": "a"}})
    rename = {"cpu0": "b", "cpu1": "a"}
    assert [(p.nodes, rename[p.device]) for p in plan.partitions] == \
           [(p.nodes, p.device) for p in renamed.partitions]
    assert plan.bottleneck_seconds == renamed.bottleneck_seconds


def test_memory_mode_with_an_annotation_keeps_one_partition_when_one_device_can_take_all():
    graph = sample_graph("mlp")
    plan = partition(graph, [cpu("cpu0"), cpu("cpu1")], "memory",
                     annotations={"ops": {"Relu": "cpu1"}})
    assert len(plan.partitions) == 1  # everything fits cpu1, which may run every node


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_listing_with_an_npu_and_a_fallback(name):
    graph = sample_graph(name)
    r = Rand(np.random.default_rng())
    devices = [npu("npu0", NPU_OPS), cpu("cpu0"), npu("npu1", NPU_OPS), cpu("cpu1")]
    check_listing_invariance(graph, devices, r)


# --------------------------------------------------------------------------------------
# copies between devices, counted here from the definitions
# --------------------------------------------------------------------------------------
def expected_transfers(graph: Graph, where: dict[str, str]) -> Counter:
    """(tensor, src, dst, bytes): one per tensor per other device that reads it."""
    made_by = producers(graph)
    readers = consumer_names(graph)
    out = Counter()
    for tensor, src in made_by.items():
        for dst in {where[c] for c in readers.get(tensor, ())} - {where[src]}:
            out[tensor, where[src], dst, graph.tensor_bytes(tensor)] += 1
    return out


def got_transfers(plan: Plan) -> Counter:
    return Counter((t.tensor, t.src, t.dst, t.bytes) for t in plan.transfers)


FOUR = 4 * WIDTH  # bytes of one [1, 64] float tensor


@pytest.mark.parametrize("mode", MODES)
def test_a_tensor_read_twice_on_one_device_crosses_once(mode):
    # t0 (cpu0) is read by s and h on cpu1, in one partition and then again in a later
    # partition on cpu1 (after n on cpu0): it crosses once.
    graph = load_graph(make_model(
        [("r", "Relu", ["x"], ["t0"]), ("s", "Sigmoid", ["t0"], ["t1"]),
         ("n", "Neg", ["t1"], ["t2"]), ("h", "Tanh", ["t0"], ["t3"]),
         ("a", "Add", ["t2", "t3"], ["y"])], ["y"]), name="twice")
    where = {"r": "cpu0", "s": "cpu1", "n": "cpu0", "h": "cpu1", "a": "cpu1"}
    plan = partition(graph, [cpu("cpu0"), cpu("cpu1")], mode, annotations={"nodes": where})
    assert placed(plan) == where
    assert got_transfers(plan) == expected_transfers(graph, where) == Counter({
        ("t0", "cpu0", "cpu1", FOUR): 1, ("t1", "cpu1", "cpu0", FOUR): 1,
        ("t2", "cpu0", "cpu1", FOUR): 1})
    t0 = next(t for t in plan.transfers if t.tensor == "t0")
    assert len(t0.dst_partitions) == len({plan.partition_of(n).name for n in ("s", "h")})
    assert sum(t.bytes for t in plan.transfers) == 3 * FOUR


@pytest.mark.parametrize("mode", MODES)
def test_a_tensor_read_on_two_other_devices_crosses_twice(mode):
    graph = load_graph(make_model(
        [("r", "Relu", ["x"], ["t0"]), ("s", "Sigmoid", ["t0"], ["t1"]),
         ("h", "Tanh", ["t0"], ["t2"]), ("n", "Neg", ["t0"], ["t3"]),
         ("a", "Add", ["t1", "t2"], ["t4"]), ("b", "Add", ["t4", "t3"], ["y"])], ["y", "t0"]),
        name="fanout")
    where = {"r": "cpu0", "s": "cpu1", "h": "cpu2", "n": "cpu2", "a": "cpu1", "b": "cpu0"}
    devices = [cpu("cpu0"), cpu("cpu1"), cpu("cpu2")]
    plan = partition(graph, devices, mode, annotations={"nodes": where})
    assert placed(plan) == where
    assert got_transfers(plan) == expected_transfers(graph, where) == Counter({
        ("t0", "cpu0", "cpu1", FOUR): 1, ("t0", "cpu0", "cpu2", FOUR): 1,
        ("t2", "cpu2", "cpu1", FOUR): 1, ("t4", "cpu1", "cpu0", FOUR): 1,
        ("t3", "cpu2", "cpu0", FOUR): 1})
    for t in plan.transfers:  # timed from both devices' links
        assert t.est_seconds == pytest.approx(
            transfer_seconds(t.bytes, plan.device(t.src), plan.device(t.dst)))


def test_a_tensor_of_another_size_and_no_copy_on_one_device():
    graph = load_graph(make_model(
        [("mm", "MatMul", ["x", "W"], ["wide"]), ("sm", "Softmax", ["wide"], ["s"]),
         ("back", "MatMul", ["s", "V"], ["y"])], ["y"],
        weights={"W": (WIDTH, 3 * WIDTH), "V": (3 * WIDTH, WIDTH)}), name="wide")
    plan = partition(graph, [npu(), cpu()], "balanced",
                     annotations={"ops": {"MatMul": "npu0"}, "fallback": "cpu0"})
    assert got_transfers(plan) == Counter({("wide", "npu0", "cpu0", 3 * FOUR): 1,
                                           ("s", "cpu0", "npu0", 3 * FOUR): 1})
    one = partition(graph, [cpu()], "balanced")
    assert one.transfers == []


def roomy_dag(data, *, min_devices: int) -> tuple[Graph, Rand, list[DeviceConfig]]:
    """A random DAG and up to 5 random devices, each with room for all of it."""
    graph = load_graph(data.draw(dag_models(3, 30)))
    r = Rand(data.draw)
    ops = sorted({n.op_type for n in graph.nodes})
    devices = [dataclasses.replace(d, memory_bytes=1 << 30) for d in
               random_devices(r, total_bytes(graph), min_devices=min_devices, max_devices=5,
                              ops=ops, tight=False)]
    return graph, r, devices


@settings(max_examples=25)
@given(data=st.data())
def test_random_placements_make_the_transfers_counted_here(data):
    graph, r, devices = roomy_dag(data, min_devices=1)
    where = {}
    for node in graph.nodes:
        able = [d.name for d in devices if can_run(d, node)]
        if not able:  # a sim device lacking the op; add a cpu that runs anything
            devices.append(cpu(f"extra{len(devices)}"))
            able = [devices[-1].name]
        where[node.name] = r.choice(able)
    for mode in MODES:
        plan = partition(graph, devices, mode, annotations={"nodes": where})
        assert placed(plan) == where
        assert got_transfers(plan) == expected_transfers(graph, where)
        # each transfer names the partitions on its device that read it, all of them
        for t in plan.transfers:
            readers = {plan.partition_of(c).name for c in consumer_names(graph)[t.tensor]
                       if where[c] == t.dst}
            assert set(t.dst_partitions) == readers
            assert plan.partition(t.src_partition).device == t.src


def test_a_copy_out_of_a_slow_link_takes_the_slow_links_time():
    graph = load_graph(make_model([("mm", "MatMul", ["x", "W"], ["a"]),
                                   ("sm", "Softmax", ["a"], ["y"])], ["y"],
                                  weights={"W": (WIDTH, WIDTH)}), name="slow")
    slow = npu("npu0", link_bandwidth=1e6)
    plan = partition(graph, [slow, cpu()], "balanced", annotations={"nodes": {"mm": "npu0"}})
    (copy,) = plan.transfers
    assert copy.src == "npu0" and copy.est_seconds >= copy.bytes / 1e6


def test_each_device_pays_its_own_end_of_a_copy():
    # a (made on npu0) is read on cpu0 and cpu1: it leaves npu0 once and enters each cpu
    graph = load_graph(make_model([("mm", "MatMul", ["x", "W"], ["a"]),
                                   ("s", "Sigmoid", ["a"], ["b"]), ("t", "Tanh", ["a"], ["c"]),
                                   ("y", "Add", ["b", "c"], ["out"])], ["out"],
                                  weights={"W": (WIDTH, WIDTH)}), name="ends")
    slow, fast = npu("npu0", link_bandwidth=1e6), cpu("cpu0", link_bandwidth=1e10)
    other = cpu("cpu1", link_bandwidth=2e10)
    where = {"mm": "npu0", "s": "cpu0", "t": "cpu1", "y": "cpu0"}
    for mode in MODES:
        plan = partition(graph, [slow, fast, other], mode, annotations={"nodes": where})
        devs = {d.name: d for d in plan.devices}
        for t in plan.transfers:
            ends = [link_seconds(t.bytes, devs[t.src]), link_seconds(t.bytes, devs[t.dst])]
            if devs[t.src].backend == "cpu":  # its tensors are in host memory already
                ends[0] = 0.0
            assert t.est_seconds == pytest.approx(max(ends))
        sender = plan.partition_of("mm")  # one copy out of the sim, over its slow link
        assert sender.transfer_out_seconds == pytest.approx(link_seconds(FOUR, slow))
        assert sender.transfer_in_seconds == 0.0
        t = plan.partition_of("t")  # a copy into cpu1, and one out of it, which costs nothing
        assert t.transfer_in_seconds == pytest.approx(link_seconds(FOUR, other))
        assert t.transfer_out_seconds == 0.0
        busy = {name: sum(p.stage_seconds
                          for p in plan.partitions if p.device == name) for name in devs}
        assert plan.device_seconds == pytest.approx(busy)
        assert plan.bottleneck_seconds == pytest.approx(max(busy.values()))


def test_balanced_keeps_a_big_tensor_off_a_slow_link():
    # Sims alike but for link and memory (more memory puts `slow` first in the canonical
    # order). Splitting the chain halves the compute, but sends a 16 KB tensor out of
    # `slow` (16 ms at 1 MB/s) or into it: more than running it all in one place.
    graph = load_graph(make_model(
        [("mm", "MatMul", ["x", "W"], ["wide"]), ("sm", "Softmax", ["wide"], ["s"]),
         ("back", "MatMul", ["s", "V"], ["y"])], ["y"],
        weights={"W": (WIDTH, 64 * WIDTH), "V": (64 * WIDTH, WIDTH)}), name="wide")
    slow = DeviceConfig(name="slow", backend="sim", link_bandwidth=1e6, peak_flops=1e9,
                        memory_bytes=1 << 30)
    quick = DeviceConfig(name="quick", backend="sim", link_bandwidth=1e12, peak_flops=1e9)
    plan = partition(graph, [slow, quick], "balanced")
    assert plan.transfers == [] or all("slow" not in (t.src, t.dst) for t in plan.transfers)


def fewest_runs(order: list[str], allowed: dict[str, frozenset[str]]) -> int:
    """The fewest stretches of `order` that each have a device allowed for all its nodes."""
    best = [0] + [len(order) + 1] * len(order)
    for i in range(len(order)):
        common = None
        for j in range(i, len(order)):
            common = allowed[order[j]] if common is None else common & allowed[order[j]]
            if not common:
                break
            best[j + 1] = min(best[j + 1], best[i] + 1)
    return best[-1]


@settings(max_examples=40)
@given(data=st.data())
def test_memory_mode_with_annotations_makes_the_fewest_partitions(data):
    """Roomy devices: no fewer partitions than runs along the plan's own order, and no more
    than the fewest runs along the order that keeps nodes placed alike together."""
    graph, r, devices = roomy_dag(data, min_devices=2)
    notes = random_annotations(r, graph, devices)
    try:
        plan = partition(graph, devices, "memory", annotations=notes)
    except PartitionError:
        return  # an annotation that cannot be honoured; covered above
    allowed = place(graph, devices, read_annotations(notes)).allowed
    assert fewest_runs(list(plan.order), allowed) <= len(plan.partitions)
    assert len(plan.partitions) <= fewest_runs(placement_order(graph, allowed), allowed)


def test_to_dot_draws_a_copy_node_per_transfer():
    graph = load_graph(make_model(
        [("r", "Relu", ["x"], ["t0"]), ("s", "Sigmoid", ["t0"], ["t1"]),
         ("h", "Tanh", ["t0"], ["t2"]), ("a", "Add", ["t1", "t2"], ["y"])], ["y"]),
        name="dot")
    where = {"r": "cpu0", "s": "cpu1", "h": "cpu2", "a": "cpu1"}
    plan = partition(graph, [cpu("cpu0"), cpu("cpu1"), cpu("cpu2")], "balanced",
                     annotations={"nodes": where})
    dot = plan.to_dot(graph)
    copies = re.findall(r'^\s*"(copy:[^"]+)" \[label="copy ', dot, re.MULTILINE)
    assert sorted(copies) == sorted(f"copy:{t.tensor}->{t.dst}" for t in plan.transfers)
    assert len(copies) == len(plan.transfers) == 3
    for t in plan.transfers:
        name = f"copy:{t.tensor}->{t.dst}"
        assert re.search(rf'-> "{re.escape(name)}" \[style=dashed[,\]]', dot)
        assert re.search(rf'"{re.escape(name)}" -> ', dot)
    # no copy node when nothing crosses
    assert "copy:" not in partition(graph, [cpu()], "balanced").to_dot(graph)


# --------------------------------------------------------------------------------------
# execution: a sim accelerator with few ops, plus a cpu fallback
# --------------------------------------------------------------------------------------
def npu_and_cpu() -> list[DeviceConfig]:
    return [npu("npu0", NPU_OPS), cpu("cpu0")]


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sim_accelerator_with_a_cpu_fallback_matches_onnxruntime(name):
    path = SAMPLES_DIR / f"{name}.onnx"
    graph = sample_graph(name)
    notes = {"ops": dict.fromkeys(sorted({n.op_type for n in graph.nodes}), "npu0")}
    rng = np.random.default_rng()
    reference = cpu_session(loadable(onnx.load(path)))
    names = [o.name for o in reference.get_outputs()]
    with HostManager(npu_and_cpu()) as host:
        plan = host.add_network(name, str(path), annotations=notes, fallback="cpu0")
        for node in graph.nodes:
            on_npu = node.op_type in NPU_OPS
            assert device_of(plan, node.name) == ("npu0" if on_npu else "cpu0"), node.name
            assert ("annotated" if on_npu else "fallback cpu0") in plan.reasons[node.name]
        for _ in range(3):
            feeds = random_feeds(input_specs(host.graph(name)), rng, default_dim=2)
            got = host.run(name, feeds).result(timeout=60)
            want = reference.run(names, feeds)
            for out, expected in zip(names, want, strict=True):
                np.testing.assert_allclose(got[out], expected, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{name}: {out}")


def test_random_dags_on_an_npu_and_a_cpu_match_onnxruntime():
    rng = np.random.default_rng()
    r = Rand(rng)
    ops = {"MatMul": "npu0", "Add": "npu0", "Relu": "npu0", "Tanh": "npu0"}
    for _ in range(3):
        model = random_dag_model(r, r.int(5, 25))
        reference = cpu_session(loadable(model))
        names = [o.name for o in reference.get_outputs()]
        with HostManager([npu("npu0", {"MatMul", "Add", "Relu"}), cpu("cpu0")]) as host:
            host.add_network("dag", model, annotations={"ops": ops}, fallback="cpu0")
            feeds = random_feeds(input_specs(host.graph("dag")), rng, default_dim=2)
            got = host.run("dag", feeds).result(timeout=60)
        for out, expected in zip(names, reference.run(names, feeds), strict=True):
            np.testing.assert_allclose(got[out], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_a_region_too_big_for_any_one_device_is_spread_over_several(mode):
    """The accelerators must take a lone MatMul and then, after a node only the reference
    device runs, a body bigger than any one of them: the body is cut into pieces, one
    accelerator holds two stretches, and the answers are onnxruntime's."""
    width, blocks = 128, 7
    model = matmul_chain(width, blocks, seed=int(np.random.default_rng().integers(1 << 30)),
                         lead=True)
    block = width * width * 4
    devices = [cpu("cpu0"), DeviceConfig(name="ref0", backend="reference"),
               *(npu(f"npu{i}", memory_bytes=int(2.5 * block)) for i in range(4))]
    notes = {"ops": {"MatMul": "sim", "Relu": "sim", "Sigmoid": "reference"}}
    reference = cpu_session(loadable(model))
    rng = np.random.default_rng()
    with HostManager(devices) as host:
        plan = host.add_network("chain", model, partition=mode, annotations=notes,
                                fallback="cpu0")
        on = [p.device for p in plan.partitions]
        assert device_of(plan, "stem") == "ref0" and device_of(plan, "head") == "cpu0"
        assert {d for d in on if d.startswith("npu")} == {f"npu{i}" for i in range(4)}, on
        held = plan.device_memory()
        assert all(held[f"npu{i}"] <= int(2.5 * block) for i in range(4)), held
        for _ in range(2):
            feeds = {"x": rng.standard_normal((8, width)).astype(np.float32)}
            got = host.run("chain", feeds).result(timeout=60)
            np.testing.assert_allclose(got["y"], reference.run(["y"], feeds)[0], rtol=1e-4,
                                       atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_annotated_weights_beyond_the_annotated_devices_are_named_in_bytes(mode):
    """Each MatMul fits an accelerator alone, all of them together do not: the error says
    how many nodes of which ops, on which devices, and the bytes needed and held."""
    width, blocks = 64, 6
    graph = load_graph(matmul_chain(width, blocks, seed=0))
    block = width * width * 4
    devices = [cpu("cpu0"), *(npu(f"npu{i}", memory_bytes=2 * block) for i in range(2))]
    with pytest.raises(PartitionError) as err:
        partition(graph, devices, mode, annotations={"ops": {"MatMul": "sim"}},
                  fallback="cpu0")
    message = str(err.value)
    assert f"{blocks} nodes (MatMul) may run only on npu0, npu1" in message, message
    assert f"need {human_bytes(blocks * block)}" in message, message
    assert f"have {human_bytes(4 * block)}" in message, message


# --------------------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------------------
CNN = str(SAMPLES_DIR / "cnn.onnx")


def cnn_files(tmp_path: Path, *, fallback_in_file: bool = True) -> tuple[str, str]:
    ops = sorted({n.op_type for n in sample_graph("cnn").nodes})
    lacking = {"BatchNormalization", "GlobalAveragePool", "Flatten"}
    devices = tmp_path / "devices.toml"
    npu_ops = ", ".join(f'"{op}"' for op in ops if op not in lacking)
    devices.write_text(f'[npu0]\nbackend = "sim"\nops = [{npu_ops}]\n\n'
                       f'[cpu0]\nbackend = "cpu"\n')
    ann = tmp_path / "ann.toml"
    head = 'fallback = "cpu0"\n' if fallback_in_file else ""
    ann.write_text(head + "[ops]\n" + "".join(f'{op} = "npu0"\n' for op in ops))
    return str(devices), str(ann)


def test_cli_run_with_annotations_checks_out(capsys, tmp_path):
    devices, ann = cnn_files(tmp_path)
    code = main(["run", CNN, "--devices", devices, "--annotate", ann, "--check",
                 "--requests", "8", "--concurrency", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err + out
    assert re.search(r"^check:", out, re.MULTILINE), out
    assert "npu0" in out and "cpu0" in out


def test_cli_partition_shows_copies_and_explains(capsys, tmp_path):
    devices, ann = cnn_files(tmp_path, fallback_in_file=False)
    code = main(["partition", CNN, "--devices", devices, "--annotate", ann, "--fallback",
                 "cpu0", "--explain", "stem/bn", "--explain", "stem/conv"])
    out, err = capsys.readouterr()
    assert code == 0, err
    graph = sample_graph("cnn")
    plan = partition(graph, [DeviceConfig(name="npu0", backend="sim", supported_ops=frozenset(
        {"Add", "Conv", "Gemm", "Relu"})), cpu()], "balanced",
        annotations=ann, fallback="cpu0")
    assert "copies between devices" in out
    for t in plan.transfers:
        assert re.search(rf"^\s*{re.escape(t.tensor)}\s+{t.src_partition}@{t.src}\s", out,
                         re.MULTILINE), t
    bn = plan.partition_of("stem/bn")
    assert (f"stem/bn (BatchNormalization) -> {bn.name} on cpu0: unsupported on npu0 -> "
            f"fallback cpu0") in out
    conv = plan.partition_of("stem/conv")
    assert f"stem/conv (Conv) -> {conv.name} on npu0: annotated npu0 (op Conv)" in out
    assert f"{len(plan.transfers)} copies between devices" in out


def test_cli_placement_errors_are_one_line(capsys, tmp_path):
    devices, ann = cnn_files(tmp_path, fallback_in_file=False)
    code = main(["partition", CNN, "--devices", devices, "--annotate", ann])
    _, err = capsys.readouterr()
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert "cannot run on npu0" in err and "devices that can: cpu0" in err
    code = main(["partition", CNN, "--devices", devices, "--annotate", ann, "--fallback", "gpu"])
    _, err = capsys.readouterr()
    assert code == 1 and "fallback device 'gpu'" in err
    code = main(["partition", CNN, "--devices", devices, "--explain", "nope"])
    _, err = capsys.readouterr()
    assert code == 1 and "no node named 'nope'" in err


@pytest.mark.parametrize("mode", ["balanced", "memory"])
@pytest.mark.parametrize("target", ["cpu0", "cpu1"])
def test_twin_devices_with_different_pins_are_not_merged(mode, target):
    """Twins (same figures, other names) share work in the balanced DP only when placement
    lets them run the same nodes: pinning everything to one twin must plan, on it."""
    graph = chain_graph()
    pins = {n.name: target for n in graph.nodes}
    plan = partition(graph, [cpu("cpu0"), cpu("cpu1")], mode, annotations={"nodes": pins})
    assert [(p.device, len(p.nodes)) for p in plan.partitions] == [(target, len(graph.nodes))]
