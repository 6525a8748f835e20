"""Constant folding at load: nodes over constants alone become initializers before the
graph is cut, within a memory bound, and the answers stay onnxruntime's. What the bound
keeps runs where it is read, or is made there as a partition loads: never sent."""

from __future__ import annotations

import resource

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from benchmarks.exports import legacy_bert, legacy_bert_feeds
from runtime.cost import CostModel
from runtime.devices import DeviceConfig, parse_devices
from runtime.fold import FOLD_GROWTH, FOLD_SLACK, fold_constants
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.partition import partition, partition_steps
from runtime.partition.build import build_plan
from runtime.partition.dot import Outline, partition_edges
from runtime.partition.order import constants_where_read, cut_bytes, model_order
from runtime.partition.pairs import keep_pairs
from runtime.partition.record import Recorder, finish, tap
from runtime.partition.segments import Segments
from tests.support.weights import (
    SHARED_MAP,
    WIDTH,
    feeds,
    identity_weights_chain,
    made_weights,
    shared_weight_chain,
)

PAGE = resource.getpagesize()


def _ort(model: onnx.ModelProto, inputs: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def _depends_on_inputs(graph) -> set[str]:
    """Tensors some graph input reaches."""
    reached = set(graph.inputs)
    for node in graph.nodes:
        if any(t in reached for t in node.reads):
            reached.update(node.writes)
    return reached


def test_identity_constant_and_transpose_over_weights_fold_away():
    model = identity_weights_chain()
    graph = load_graph(model)
    assert [n.name for n in graph.nodes] == ["first", "bias", "reshape", "relu", "second"]
    assert set(graph.folded.nodes) == {"w1_identity", "b_identity", "shape_constant",
                                       "w2_transpose"}
    for tensor in ("w1_id", "b_id", "shape", "w2_t"):
        assert graph.is_weight(tensor)
    x = feeds(3)
    for got, want in zip(_ort(graph.model, x), _ort(model, x), strict=True):
        np.testing.assert_array_equal(got, want)


def test_no_weight_crosses_devices_in_a_legacy_bert_plan():
    model = legacy_bert(layers=2, hidden=64, heads=4, seq=16)
    unfolded = load_graph(model, fold=False)
    graph = load_graph(model)
    identities = [n for n in unfolded.nodes if n.op_type == "Identity"
                  and unfolded.is_weight(n.inputs[0])]
    assert identities and not any(n.op_type in ("Identity", "Constant") and not any(
        t in _depends_on_inputs(graph) for t in n.reads) for n in graph.nodes)
    for g, folded in ((unfolded, False), (graph, True)):
        plan = partition(g, parse_devices("cpu:2"), "balanced")
        live = _depends_on_inputs(g)
        # unfolded, a partition reading a weight's Identity from another holds it as well
        assert not [t.tensor for t in plan.transfers if t.tensor not in live]
        works = {n for p in plan.partitions for n in p.nodes}
        assert any(g.node(n).op_type == "Identity" and g.node(n).reads[0] not in live
                   for n in works) != folded  # folded: no such node is work
    inputs = legacy_bert_feeds(model)
    devices = [DeviceConfig(name=f"cpu{i}", memory_bytes=64 << 20) for i in range(2)]
    with HostManager(devices) as host:
        plan = host.add_network("bert", model)
        assert len(plan.partitions) == 2
        got = host.infer("bert", inputs)
    for name, want in zip(("last_hidden_state", "pooler_output"), _ort(model, inputs),
                          strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5)


def test_a_weight_two_partitions_read_is_on_both_devices_and_counted_on_both():
    graph = load_graph(shared_weight_chain())
    plan = partition(graph, parse_devices("cpu:2"), "user", user_map=SHARED_MAP)
    size = WIDTH * WIDTH * 4
    assert [("w" in p.weights, p.device) for p in plan.partitions] == [
        (True, "cpu0"), (True, "cpu1")]
    assert all(p.weight_bytes >= size for p in plan.partitions)
    assert all(m >= size for m in plan.device_memory().values())
    assert not any(t.tensor == "w" for t in plan.transfers)
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("shared", shared_weight_chain(), partition=SHARED_MAP)
        assert all(d.used_bytes >= size for d in host.devices.values())
        x = feeds()
        w = numpy_helper.to_array(shared_weight_chain().graph.initializer[0])
        np.testing.assert_allclose(host.infer("shared", x)["y"],
                                   np.maximum(x["x"] @ w, 0) @ w, rtol=1e-5, atol=1e-4)


def _growing(size: int) -> onnx.ModelProto:
    """y = x + ConstantOfShape([size, WIDTH]) sliced back to x's rows: the constant is
    tiny, its value `size` rows."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, WIDTH])
    shape = numpy_helper.from_array(np.array([size, WIDTH], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["ones"], name="fill",
                              value=numpy_helper.from_array(np.array([1.5], np.float32))),
             helper.make_node("Add", ["x", "ones"], ["y"], name="add")]
    model = helper.make_model(helper.make_graph(nodes, "growing", [x], [y], [shape]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_a_fold_that_would_inflate_memory_past_the_bound_keeps_its_node():
    small, large = _growing(8), _growing(4096)  # 1 KiB of ones is folded, 512 KiB is not
    report = fold_constants(small)
    assert report.nodes == ("fill",) and [n.op_type for n in small.graph.node] == ["Add"]
    report = fold_constants(large)
    assert report.nodes == () and "fill" in report.kept
    assert [n.op_type for n in large.graph.node] == ["ConstantOfShape", "Add"]
    assert report.bytes_after <= FOLD_GROWTH * report.bytes_before + FOLD_SLACK
    x = {"x": np.random.default_rng().standard_normal((4096, WIDTH)).astype(np.float32)}
    np.testing.assert_array_equal(_ort(large, x)[0], x["x"] + np.float32(1.5))


def test_a_fold_rewrites_the_model_in_place_copying_no_weight():
    """load_graph folds its own copy of the model: the weights kept are not copied again
    (protobuf copies each tensor put into a graph: a 500 MB VGG's fold copied it twice)."""
    shape = [1 << 10, 1 << 14]  # 64 MB: past glibc's mmap threshold, so a copy faults it
    big = numpy_helper.from_array(np.random.default_rng().standard_normal(shape, np.float32),
                                  "big")
    nodes = [helper.make_node("Constant", [], ["one"], name="one",
                              value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("Add", ["x", "big"], ["a"], name="a"),
             helper.make_node("Add", ["a", "one"], ["y"], name="y")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    model = helper.make_model(helper.make_graph(nodes, "in_place", [x], [y], [big]),
                              opset_imports=[helper.make_opsetid("", 17)])
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    report = fold_constants(model)
    faulted = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) * PAGE
    assert report.nodes == ("one",) and [n.name for n in model.graph.node] == ["a", "y"]
    assert sorted(t.name for t in model.graph.initializer) == ["big", "one"]
    assert faulted < big.ByteSize() / 4  # a copy faults all of them


def test_a_constant_the_bound_keeps_runs_in_the_partition_that_reads_it():
    """Not in the first partition, whose device would send it on every request."""
    model = made_weights(8)
    graph = load_graph(model)
    assert len(graph.folded.kept) == 8
    devices = parse_devices("sim:4")
    plan = partition(graph, devices)
    assert len(plan.partitions) > 1
    assert not [t.tensor for t in plan.transfers if t.tensor.startswith("w")]
    home = {n: p.name for p in plan.partitions for n in p.nodes}
    assert all(home[f"fill{i}"] == home[f"mm{i}"] for i in range(8))
    x = {"h0": np.random.default_rng().standard_normal((3, 256)).astype(np.float32)}
    with HostManager(devices) as host:
        host.add_network("made", model)
        np.testing.assert_allclose(host.infer("made", x)["h8"], _ort(model, x)[0], rtol=1e-5)


def test_a_cut_after_a_constant_the_bound_keeps_moves_it_to_its_reader():
    """Measured costs may cut between a kept ConstantOfShape and the MatMul reading it
    (onnxruntime folds it inside the session, so its run costs nothing): after the split
    it moves to its reader's partition, a chain of them whole, rather than the reader's
    partition making the weight again as it loads. (light_resnet50 on cpu:2,sim:2 sent a
    147 KB weight on every request so.)"""
    model = made_weights(4)
    fill = next(n for n in model.graph.node if n.name == "fill0")  # w0 = Relu(Cast(fill0))
    fill.output[0] = "w0_fill"
    model.graph.node.insert(4, helper.make_node("Cast", ["w0_fill"], ["w0_cast"], name="cast",
                                                to=TensorProto.FLOAT))
    model.graph.node.insert(5, helper.make_node("Relu", ["w0_cast"], ["w0"], name="relu"))
    graph = load_graph(model)
    assert {"fill0", "cast", "relu"} <= graph.constant_nodes and "fill0" in graph.folded.kept
    devices, costs = parse_devices("cpu:2"), CostModel.roofline(graph)
    order = constants_where_read(graph, model_order(graph))
    for reader in ("mm0", "mm2"):
        cut = order.index(graph.producer[graph.node(reader).inputs[1]])  # just before it
        plan = build_plan(graph, costs, devices, [("p0", "cpu0", order[:cut + 1]),
                                                  ("p1", "cpu1", order[cut + 1:])],
                          mode="balanced", order=order)
        assert all(t.tensor.startswith("h") for t in plan.transfers)  # made as p1 loads
        assert [w for p in plan.partitions for w in p.weights if not graph.is_weight(w)]
        steps: list = []
        anywhere = {n.name: frozenset({"cpu0", "cpu1"}) for n in graph.nodes}
        moved, _ = finish(tap(keep_pairs(graph, costs, devices, plan, anywhere, Recorder()),
                              steps.append))
        assert all(t.tensor.startswith("h") for t in moved.transfers), reader
        assert all(map(graph.is_weight, (w for p in moved.partitions for w in p.weights)))
        home = {n: p.name for p in moved.partitions for n in p.nodes}
        chain = ("fill0", "cast", "relu") if reader == "mm0" else ("fill2",)
        assert {home[n] for n in chain} == {home[reader]}, reader
        assert any(s.kind == "move" and "computed from weights alone" in s.reason
                   for s in steps)
    x = {"h0": np.random.default_rng().standard_normal((3, 256)).astype(np.float32)}
    with HostManager(devices) as host:
        host.add_network("made", model)
        np.testing.assert_allclose(host.infer("made", x)["h4"], _ort(model, x)[0], rtol=1e-5)


def test_a_split_is_costed_without_copies_of_weights_made_before_it():
    """A stretch reading a weight an earlier stretch's node made is charged no copy for
    it, in or out: the stretch makes it as it loads, as the plan built from it does."""
    graph = load_graph(made_weights(4))
    order = model_order(graph)  # the fills first, as the file has them
    seg = Segments(graph, CostModel.roofline(graph), order)
    cut = order.index("mm2")
    assert set(seg.incoming(cut, len(order))) == set(seg.outgoing(0, cut)) == {"h2"}
    assert cut_bytes(graph, order)[cut] == graph.tensor_bytes("h2")  # as orders are chosen


@pytest.mark.parametrize("maker", ["ConstantOfShape", "DequantizeLinear"])
def test_a_device_that_cannot_make_a_weight_holds_it_made_as_it_loads(maker):
    """Accelerators that run MatMul alone, a cpu fallback making each weight (a kept
    ConstantOfShape, an int8 weight's DequantizeLinear): each accelerator's partition
    holds the weights it reads, made on the host as it loads, and no request sends one."""
    model = made_weights(6)
    if maker == "DequantizeLinear":
        rng = np.random.default_rng()
        for node in [n for n in model.graph.node if n.op_type == "ConstantOfShape"]:
            q = numpy_helper.from_array(rng.integers(-127, 128, (256, 256), np.int8),
                                        f"{node.output[0]}_q")
            model.graph.initializer.extend([q, numpy_helper.from_array(
                np.array(1 / 4096, np.float32), f"{node.output[0]}_scale")])
            node.CopyFrom(helper.make_node(maker, [q.name, f"{node.output[0]}_scale"],
                                           node.output, name=node.name))
        model.graph.initializer.remove(model.graph.initializer[0])  # the fills' shape
    graph = load_graph(model)
    devices = parse_devices("cpu:1,sim:2:ops=MatMul")
    plan = partition(graph, devices, annotations={"ops": {"MatMul": "sim"}}, fallback="cpu0")
    on_sims = [p for p in plan.partitions if p.device != "cpu0"]
    assert on_sims and {graph.node(n).op_type for p in on_sims for n in p.nodes} == {"MatMul"}
    assert not [t.tensor for t in plan.transfers if t.tensor.startswith("w")]
    assert {w for p in on_sims for w in p.weights} == {f"w{i}" for i in range(6)}
    weight = 256 * 256 * 4  # held as a weight, not an activation, on the device reading it
    assert sum(p.weight_bytes for p in on_sims) == 6 * weight
    assert all(p.activation_bytes < weight for p in on_sims)
    fills = {p.name for p in plan.partitions if p.device == "cpu0"}  # the fills alone
    assert fills and not {e.src for e in partition_edges(plan, Outline.of(graph))} & fills
    x = {"h0": np.random.default_rng().standard_normal((3, 256)).astype(np.float32)}
    with HostManager(devices) as host:
        host.add_network("made", model, annotations={"ops": {"MatMul": "sim"}},
                         fallback="cpu0")
        want = _ort(model, x)[0]
        np.testing.assert_allclose(host.infer("made", x)["h6"], want, rtol=1e-4,
                                   atol=1e-4 * np.abs(want).max())


def test_a_partition_left_making_weights_for_no_one_joins_one_that_works():
    """The fills a fallback device makes for accelerators that make their weights as they
    load send nothing: they join the device's partition that does work, and no request
    runs a partition for no one."""
    model = made_weights(4)
    model.graph.node.append(helper.make_node("Softmax", ["h4"], ["p"], name="softmax"))
    model.graph.output[0].name = "p"
    graph = load_graph(model)
    devices = parse_devices("cpu:1,sim:2:ops=MatMul")
    annotations = {"ops": {"MatMul": "sim"}}
    steps = list(partition_steps(graph, devices, annotations=annotations, fallback="cpu0"))
    plan = partition(graph, devices, annotations=annotations, fallback="cpu0")
    [on_cpu] = [p for p in plan.partitions if p.device == "cpu0"]
    assert set(on_cpu.nodes) == {"softmax", *(f"fill{i}" for i in range(4))}
    assert on_cpu.activation_bytes < 256 * 256 * 4  # it holds no weight for the others
    assert any(s.kind == "move" and "would run for no one" in s.reason for s in steps)
    x = {"h0": np.random.default_rng().standard_normal((3, 256)).astype(np.float32)}
    with HostManager(devices) as host:
        host.add_network("made", model, annotations=annotations, fallback="cpu0")
        np.testing.assert_allclose(host.infer("made", x)["p"], _ort(model, x)[0], rtol=1e-5,
                                   atol=1e-7)


def test_a_sequence_made_from_weights_is_copied_a_tensor_made_from_it_is_held():
    """Only tensors are made as a partition loads (a weight is a tensor): a sequence of
    weights another device reads crosses as any value does."""
    rng = np.random.default_rng()
    weights = [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), n)
               for n in ("a", "b")]
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"], name="seq"),
             helper.make_node("ConcatFromSequence", ["s"], ["w"], axis=1, name="cat"),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = helper.make_model(helper.make_graph(
        nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], weights),
        opset_imports=[helper.make_opsetid("", 17)])
    x = {"x": rng.standard_normal((3, 4)).astype(np.float32)}
    for ops, crossing in (("MatMul+ConcatFromSequence", ["s"]), ("MatMul", [])):
        devices = parse_devices(f"cpu:1,sim:1:ops={ops}")
        annotations = {"ops": {"MatMul": "sim", "ConcatFromSequence": "sim"}}
        with HostManager(devices) as host:
            plan = host.add_network("seq", model, annotations=annotations, fallback="cpu0")
            assert [t.tensor for t in plan.transfers] == crossing
            np.testing.assert_allclose(host.infer("seq", x)["y"], _ort(model, x)[0],
                                       rtol=1e-5)


def test_a_weight_read_through_several_copies_is_bounded_by_the_growth_factor():
    """Three scaled copies of one weight would make 3x its bytes: folded nodes stay nodes,
    the one growing memory most first, until the constants are within FOLD_GROWTH."""
    rows = 1024  # 128 KiB: the slack does not cover a copy
    w = np.random.default_rng().standard_normal((rows, WIDTH)).astype(np.float32)
    scales = [numpy_helper.from_array(np.array(i + 2.0, np.float32), f"s{i}") for i in range(3)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, WIDTH])
    nodes = [helper.make_node("Mul", ["w", f"s{i}"], [f"c{i}"], name=f"scale{i}")
             for i in range(3)]
    nodes += [helper.make_node("Add", ["x", "c0"], ["a"], name="a"),
              helper.make_node("Add", ["a", "c1"], ["b"], name="b"),
              helper.make_node("Add", ["b", "c2"], ["y"], name="y")]
    model = helper.make_model(helper.make_graph(
        nodes, "copies", [x], [y], [numpy_helper.from_array(w, "w"), *scales]),
        opset_imports=[helper.make_opsetid("", 17)])
    report = fold_constants(model)
    assert len(report.nodes) == 1 and len(report.kept) == 2
    assert report.bytes_after <= FOLD_GROWTH * report.bytes_before + FOLD_SLACK
    stored = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    assert stored == report.bytes_after <= FOLD_GROWTH * w.nbytes + FOLD_SLACK
    feed = {"x": np.random.default_rng().standard_normal((rows, WIDTH)).astype(np.float32)}
    np.testing.assert_allclose(_ort(model, feed)[0], feed["x"] + 9 * w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["DequantizeLinear", "RandomNormalLike"])
def test_dequantize_and_random_ops_are_never_folded(op):
    w = numpy_helper.from_array(np.arange(WIDTH, dtype=np.int8).reshape(1, WIDTH), "w")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    inputs = ["w", "scale"] if op == "DequantizeLinear" else ["scale"]
    node = helper.make_node(op, inputs, ["c"], name="const_op")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph(
        [node, helper.make_node("Add", ["x", "c"], ["y"], name="add")], "q", [x], [y],
        [w, scale]), opset_imports=[helper.make_opsetid("", 19)])
    before = model.SerializeToString()
    report = fold_constants(model)
    assert report.nodes == () and model.SerializeToString() == before


@pytest.mark.parametrize("ir_version", [3, onnx.IR_VERSION])
def test_weights_an_old_exporter_lists_as_inputs_fold_like_any_other(ir_version):
    """Older exporters list every initializer as a graph input too. Prism takes no feed
    for one (onnxruntime takes none either before IR 4), so they are constants: left
    unfolded, a weight made from them would cross devices on every request."""
    model = identity_weights_chain()
    model.ir_version = ir_version
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                             for t in model.graph.initializer)
    graph = load_graph(model)
    assert set(graph.folded.nodes) == set(load_graph(identity_weights_chain()).folded.nodes)
    assert graph.inputs == ["x"]
    assert [i.name for i in graph.model.graph.input] == ["x"]  # unread weights went too
    x = feeds(3)
    for got, want in zip(_ort(graph.model, x), _ort(model, x), strict=True):
        np.testing.assert_array_equal(got, want)


def test_folding_can_be_turned_off():
    graph = load_graph(identity_weights_chain(), fold=False)
    assert len(graph.nodes) == 9 and graph.folded.nodes == ()
