"""The measured cost model: nodes timed on this machine at the first load and cached, the
roofline where nothing was timed, plans balanced on what was measured, and the live
run's times feeding the next plan. No assertion here is about how fast anything ran:
what is checked is where times come from and where they go."""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime.cost import CostModel, Timings, kind_of
from runtime.cost.cache import TimingsCache
from runtime.devices import DeviceConfig, parse_devices
from runtime.devices.ort.sessions import cpu_session
from runtime.errors import InvalidInputError, PartitionError, PrismError
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.partition import measure, partition
from runtime.partition import planning as planning_module
from runtime.partition.measure import calibration_feeds, measure_nodes, refined
from runtime.partition.planning import COSTS_ENV, live_costs, plan_network
from runtime.user_cache import CACHE_ENV, cache_dir
from tests.support.dags import SAMPLES_DIR, end_token_ids, end_token_model, even_rows_model
from tests.support.hosts import toy_chain
from tests.support.weights import made_weights

CNN = SAMPLES_DIR / "cnn.onnx"
NO_HOPS: dict[str, float] = {}  # keep the machine's dispatch probe out of unit tests


@pytest.fixture
def cache(tmp_path) -> TimingsCache:
    return TimingsCache(tmp_path / "cache")


def test_a_first_load_times_every_node_and_a_later_one_reads_the_cache(cache, monkeypatch):
    graph = load_graph(CNN)
    devices = parse_devices("cpu:2")
    seen: list[tuple[str, int, int]] = []
    _, plan = plan_network(graph, devices, costs="measured", hops=NO_HOPS, cache=cache,
                           on_progress=lambda *a: seen.append(a))
    assert plan.costs == "measured" and seen, "the first load measures, and says so"
    stored = cache.get(graph, kind_of(devices[0]))
    assert stored is not None and set(stored.nodes) == {n.name for n in graph.nodes}
    assert all(t >= 0 for t in stored.nodes.values()) and stored.run_seconds > 0
    for p in plan.partitions:  # a partition costs its run's fixed cost plus its nodes
        assert p.est_seconds == pytest.approx(
            stored.run_seconds + sum(stored.nodes[n] for n in p.nodes))

    def never(*args, **kwargs):
        raise AssertionError("a cached network is not measured again")

    monkeypatch.setattr(planning_module, "measure_nodes", never)
    monkeypatch.setattr(planning_module, "time_partitions", never)
    _, again = plan_network(graph, devices, costs="measured", hops=NO_HOPS, cache=cache)
    assert again.costs == "measured" and again.partitions == plan.partitions


class _Sleeps:
    """A stand-in for a sub-model's session whose run takes `seconds`, counted."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.runs = seconds, 0

    def run(self, feeds: dict) -> dict:
        self.runs += 1
        time.sleep(self.seconds)
        return {"y": np.zeros(1)}


def test_a_sub_model_whose_runs_take_long_is_timed_by_one_run(monkeypatch):
    """keypointrcnn's runs take seconds each; five of them after two to warm, per chunk
    and per partition timed, made its first load take four minutes."""
    monkeypatch.setattr(measure, "SLOW", 0.05)
    slow = _Sleeps(0.06)  # past BUDGET and SLOW
    seconds, outputs = measure.timed_run(slow, {})
    assert slow.runs == 1 and seconds >= 0.06 and "y" in outputs
    middling = _Sleeps(0.02)  # past BUDGET: warmed once, then runs until SLOW
    measure.timed_run(middling, {})
    assert 2 <= middling.runs <= 1 + measure.MIN_RUNS
    fast = _Sleeps(0.0)
    measure.timed_run(fast, {})
    assert fast.runs >= 2 + measure.MIN_RUNS


def test_the_cache_key_follows_device_kind_versions_and_cpu(cache, monkeypatch):
    graph = load_graph(CNN)
    timings = Timings({n.name: 1e-6 for n in graph.nodes}, 2e-6)
    one, two = (kind_of(DeviceConfig(name="c", threads=t)) for t in (1, 2))
    cache.put(graph, one, timings)
    assert cache.get(graph, one) == timings and cache.get(graph, two) is None
    assert cache.get(load_graph(toy_chain()), one) is None  # another network
    monkeypatch.setattr("runtime.cost.cache.installed", lambda package: "0.0-other")
    assert cache.get(graph, one) is None  # another onnxruntime measures again
    monkeypatch.undo()
    monkeypatch.setattr("runtime.cost.cache.cpu_model", lambda: "another processor")
    assert cache.get(graph, one) is None


def test_threads_that_sleep_between_runs_are_timed_so_and_cached_apart(cache, monkeypatch):
    """A device whose threads do not spin (`spin=0`) runs slower small sessions: its nodes
    are timed on sessions that do not spin either, and cached as a kind of their own. One
    thread has none to spin: its kind is one."""
    graph = load_graph(CNN)
    still = parse_devices("cpu:2:threads=2:spin=0")
    spinning = kind_of(DeviceConfig(name="c", threads=2))
    assert kind_of(still[0]) != spinning
    assert kind_of(DeviceConfig(name="c", spin=False)) == kind_of(DeviceConfig(name="c"))
    spins: list[bool] = []

    def session(*args, spin=True, **kwargs):
        spins.append(spin)
        return cpu_session(*args, spin=spin, **kwargs)

    monkeypatch.setattr(measure, "cpu_session", session)
    _, plan = plan_network(graph, still, costs="measured", hops=NO_HOPS, cache=cache)
    assert plan.costs == "measured" and spins and not any(spins)
    assert cache.get(graph, kind_of(still[0])) is not None
    assert cache.get(graph, spinning) is None


def test_a_damaged_cache_entry_is_a_miss(cache):
    graph = load_graph(CNN)
    kind = kind_of(DeviceConfig(name="c"))
    path = cache.put(graph, kind, Timings({"x": 1.0}))
    assert path is not None
    Path(path).write_text("{not json", encoding="utf-8")
    assert cache.get(graph, kind) is None


def test_the_cache_lives_in_the_users_cache_folder_unless_told(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr("sys.platform", "linux")
    assert cache_dir() == tmp_path / "xdg" / "prism"


def test_modelled_devices_keep_the_roofline(cache):
    """`sim` keeps its modelled time; a cpu beside it is measured."""
    graph = load_graph(CNN)
    sims = parse_devices("sim:2")
    _, modelled = plan_network(graph, sims, costs="measured", hops=NO_HOPS, cache=cache)
    assert modelled.costs == "model"
    assert modelled.partitions == partition(graph, sims, "balanced").partitions
    mixed = parse_devices("cpu:1,sim:1")
    model, fresh = planning_module.measured_model(graph, mixed, NO_HOPS, cache=cache)
    assert fresh == [kind_of(mixed[0])] and list(model.timings) == fresh
    roofline = CostModel.roofline(graph)
    node = graph.nodes[0].name
    assert model.node_seconds(node, mixed[1]) == roofline.node_seconds(node, mixed[1])
    assert model.node_seconds(node, mixed[0]) == model.timings[fresh[0]].nodes[node]


def test_a_node_never_timed_costs_what_the_roofline_says():
    graph = load_graph(CNN)
    cpu = DeviceConfig(name="cpu0")
    first, *rest = [n.name for n in graph.nodes]
    model = CostModel(CostModel.roofline(graph).costs,
                      {kind_of(cpu): Timings(dict.fromkeys(rest, 7e-6), 1e-6)})
    assert model.node_seconds(rest[0], cpu) == 7e-6
    assert model.node_seconds(first, cpu) == CostModel.roofline(graph).node_seconds(first, cpu)


def _sequence_input_model() -> onnx.ModelProto:
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    node = helper.make_node("SequenceAt", ["s", "i"], ["y"], name="at")
    index = helper.make_tensor("i", TensorProto.INT64, [], [0])
    model = helper.make_model(helper.make_graph([node], "seq", [seq], [y], [index]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_a_network_that_cannot_be_measured_keeps_the_roofline(cache):
    graph = load_graph(_sequence_input_model())
    assert calibration_feeds(graph) is None
    assert measure_nodes(graph, DeviceConfig(name="cpu0")) is None
    _, plan = plan_network(graph, parse_devices("cpu:1"), costs="measured", hops=NO_HOPS,
                           cache=cache)
    assert plan.costs == "model"


def test_a_network_failing_on_made_up_inputs_is_timed_once_and_says_why(cache, caplog,
                                                                         monkeypatch):
    """A model taking only some sizes fails on made-up inputs, so its costs stay the
    roofline's. That was silent, and timed again for each device of the kind."""
    graph = load_graph(even_rows_model())
    timings, timed = [], planning_module.measure_nodes
    monkeypatch.setattr(planning_module, "measure_nodes",
                        lambda *args: timings.append(args) or timed(*args))
    with caplog.at_level(logging.WARNING, logger=measure.__name__):
        _, plan = plan_network(graph, parse_devices("cpu:2"), costs="measured",
                               hops=NO_HOPS, cache=cache)
    assert plan.costs == "model" and len(timings) == 1
    [said] = [r.getMessage() for r in caplog.records if r.name == measure.__name__]
    assert said.startswith(f"timing {graph.name} on ort-cpu/1 failed"), said
    assert "'pair'" in said and said.endswith("(on made-up inputs x [1, 4]: the model may take "
                                              "only some sizes or values: give them with "
                                              "--bind DIM=N and --inputs, or bindings and "
                                              "sample_feeds)"), said


def _measuring_said(graph, devices: str, cache, caplog) -> logging.LogRecord:
    """What measuring logged, once, planning `graph` on `devices` that kept the roofline."""
    with caplog.at_level(logging.INFO, logger=measure.__name__):
        _, plan = plan_network(graph, parse_devices(devices), costs="measured",
                               hops=NO_HOPS, cache=cache)
    assert plan.costs == "model"
    [record] = [r for r in caplog.records if r.name == measure.__name__]
    return record


def test_a_network_onnxruntime_cannot_load_keeps_the_roofline_quietly(cache, caplog):
    """A convolution striding one of its two axes (a malformed node onnx's checker passes)
    fails to load whatever it is fed: its plan's load says so in one line, and the
    measurement's failure, no warning above it, blames no inputs."""
    rng = np.random.default_rng()
    f = TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", strides=[1])], "strided",
        [helper.make_tensor_value_info("x", f, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", f, None)],
        [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    graph = load_graph(model)
    record = _measuring_said(graph, "cpu:1", cache, caplog)
    said = record.getMessage()
    assert record.levelno == logging.INFO, said
    assert "onnxruntime cannot load" in said and "strides" in said and "inputs" not in said
    with pytest.raises(PrismError, match=r"cannot load .* strides"), HostManager(
            parse_devices("cpu:1")) as host:
        host.add_network("strided", graph, costs="model")


def test_a_network_with_a_node_only_its_fallback_runs_is_measured_around_it(cache):
    """A Relu on int16, which onnxruntime's CPU has no kernel for, runs on a reference
    device: the cpu's nodes before and after it are still timed (what it makes is made
    up for them), and only it keeps the roofline."""
    rng = np.random.default_rng()
    f = TensorProto.FLOAT
    weights = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), w)
               for w in ("w1", "w2")]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
         helper.make_node("Cast", ["a"], ["a16"], name="narrow", to=TensorProto.INT16),
         helper.make_node("Relu", ["a16"], ["r16"], name="relu16"),
         helper.make_node("Cast", ["r16"], ["r"], name="widen", to=f),
         helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")], "fallback",
        [helper.make_tensor_value_info("x", f, ["n", 64])],
        [helper.make_tensor_value_info("y", f, None)], weights),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    graph = load_graph(model)
    devices = parse_devices("cpu:1,reference:1")
    _, plan = plan_network(graph, devices, costs="measured", hops=NO_HOPS, cache=cache)
    assert plan.costs == "measured"
    assert [p.device for p in plan.partitions if "relu16" in p.nodes] == ["reference0"]
    stored = cache.get(graph, kind_of(devices[0]))
    assert stored is not None and set(stored.nodes) == {"mm1", "narrow", "widen", "mm2"}
    roofline = CostModel.roofline(graph).node_seconds("mm2", devices[0])
    assert stored.nodes["mm2"] != roofline, "the node after the fallback's was timed"
    timed = measure.time_partitions(graph, plan)  # the plan's own partitions, so too
    assert timed is not None and set(timed) == {p.name for p in plan.partitions
                                                if p.device == "cpu0"}


def test_a_run_on_what_a_fallback_node_made_up_fails_quietly(cache, caplog):
    """Made-up zeros for a shape that only the fallback computes make the Expand after it
    fail: the roofline stays, logged at info level, blaming no inputs of the user's."""
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"),
         helper.make_node("Cast", ["s"], ["s16"], name="narrow", to=TensorProto.INT16),
         helper.make_node("Relu", ["s16"], ["r16"], name="relu16"),
         helper.make_node("Cast", ["r16"], ["r"], name="widen", to=TensorProto.INT64),
         helper.make_node("Expand", ["x", "r"], ["y"], name="expand")], "shaped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    record = _measuring_said(load_graph(model), "cpu:1,reference:1", cache, caplog)
    assert record.levelno == logging.INFO and "expand" in record.getMessage().lower()
    assert "inputs" not in record.getMessage()


def _unrunnable() -> tuple[onnx.ModelProto, dict[str, int], str]:
    f = TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"]),
         helper.make_node("Mystery", ["h"], ["y"], name="mystery", domain="example.ops")],
        "unrunnable", [helper.make_tensor_value_info("x", f, ["n", 8])],
        [helper.make_tensor_value_info("y", f, ["n", 8])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.ops", 1)])
    return model, {}, r"node mystery .* cannot run on"


def _too_wide() -> tuple[onnx.ModelProto, dict[str, int], str]:
    f = TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r0")], "wide",
        [helper.make_tensor_value_info("x", f, ["n", 1024])],
        [helper.make_tensor_value_info("y", f, ["n", 1024])]),
        opset_imports=[helper.make_opsetid("", 17)])
    rows = int(np.random.default_rng().integers(300, 900))  # 1.2-3.7 MB a tensor
    return model, {"n": rows}, r"node r0 needs .* the largest device has 1\.0 MB"


@pytest.mark.parametrize("made", [_unrunnable, _too_wide])
def test_what_no_plan_could_be_is_said_before_anything_is_measured(made, cache, monkeypatch):
    """Placement and each node's memory are checked first. Measuring a node no device runs
    spent its seconds on chunks that could not load, and warned about them above the
    error; measuring runs each node at the sizes bound, on this machine, and a Swin bound
    to a batch of 100,000 was measured until the kernel killed it for want of memory."""
    model, bindings, said = made()
    model.ir_version = 9
    graph = load_graph(model, bindings=bindings)
    timings = []
    monkeypatch.setattr(planning_module, "measure_nodes", lambda *args: timings.append(args))
    with pytest.raises(PartitionError, match=said):
        plan_network(graph, parse_devices("cpu:2:mem=1MB"), costs="measured", hops=NO_HOPS,
                     cache=cache)
    assert timings == []


def _chain(n: int) -> onnx.ModelProto:
    """x -> Relu -> Relu -> ... (n nodes): equal in the roofline."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    names = ["x", *(f"h{i}" for i in range(n - 1)), "y"]
    nodes = [helper.make_node("Relu", [a], [b], name=f"r{i}")
             for i, (a, b) in enumerate(itertools.pairwise(names))]
    model = helper.make_model(helper.make_graph(nodes, "chain", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_balanced_splits_where_the_measured_times_say():
    """Ten nodes alike to the roofline; measured, the first two are as slow as the other
    eight together, and the split falls after them."""
    graph = load_graph(_chain(10))
    devices = parse_devices("cpu:2")
    roofline = partition(graph, devices, "balanced")
    assert [len(p.nodes) for p in roofline.partitions] != [2, 8]
    times = {f"r{i}": 4e-4 if i < 2 else 1e-4 for i in range(10)}
    model = CostModel(CostModel.roofline(graph).costs,
                      {kind_of(devices[0]): Timings(times, 1e-5)}, {"cpu": 2e-5})
    measured = partition(graph, devices, "balanced", costs=model)
    assert [len(p.nodes) for p in measured.partitions] == [2, 8]
    assert measured.costs == "measured"
    for p in measured.partitions:
        assert p.est_seconds == pytest.approx(1e-5 + sum(times[n] for n in p.nodes))
        assert p.transfer_in_seconds >= 2e-5  # every run is dispatched: the measured hop
    assert measured.bottleneck_seconds == pytest.approx(max(
        p.stage_seconds for p in measured.partitions))


def test_refined_scales_each_partition_to_what_it_measured():
    graph = load_graph(_chain(6))
    devices = parse_devices("cpu:2")
    kind = kind_of(devices[0])
    model = CostModel(CostModel.roofline(graph).costs,
                      {kind: Timings({f"r{i}": 1e-5 for i in range(6)}, 2e-6)})
    plan = partition(graph, devices, "balanced", costs=model)
    measured = {plan.partitions[0].name: 50e-6, plan.partitions[1].name: 20e-6}
    better = refined(model, plan, measured)
    for p in plan.partitions:
        total = better.run_seconds(devices[0]) + sum(better.node_seconds(n, devices[0])
                                                     for n in p.nodes)
        assert total == pytest.approx(measured[p.name])


@pytest.mark.parametrize("spec, folds", [("cpu:1", True), ("sim:1", True),
                                         ("reference:1", False)])
def test_a_node_made_from_weights_alone_costs_a_run_only_where_nothing_folds(spec, folds):
    """The roofline charges a kept fill nothing on a device whose program folds it as it
    loads; onnx's reference evaluator runs it every time."""
    graph = load_graph(made_weights(2))
    model, device = CostModel.roofline(graph), parse_devices(spec)[0]
    assert (model.node_seconds("fill0", device) == 0.0) == folds
    assert model.node_seconds("mm0", device) > 0


def test_a_node_made_from_weights_alone_takes_no_share_of_a_run(cache):
    """onnxruntime folds what the fold's bound kept (each weight's ConstantOfShape) as a
    session loads, so no run holds its time: it costs nothing, timed or re-planned live,
    and the MatMuls reading the weights hold all their runs' time."""
    graph = load_graph(made_weights(4), bindings={"N": 64})  # ~1 ms a MatMul, past noise
    device = DeviceConfig(name="cpu0")
    timed = measure_nodes(graph, device)
    assert timed is not None and graph.constant_nodes == {f"fill{i}" for i in range(4)}
    assert [timed.nodes[f"fill{i}"] for i in range(4)] == [0.0] * 4
    assert all(timed.nodes[f"mm{i}"] > 0 for i in range(4))
    plan = partition(graph, parse_devices("cpu:2"), "balanced")
    live = live_costs(graph, plan, {p.name: 1e-4 for p in plan.partitions}, hops=NO_HOPS,
                      cache=cache)
    assert [live.node_seconds(f"fill{i}", device) for i in range(4)] == [0.0] * 4


def test_live_run_times_feed_the_next_plan(cache):
    """A running plan whose first stage measured three times slower than the second: its
    times, fed back, move work off the first stage."""
    graph = load_graph(_chain(12))
    devices = parse_devices("cpu:2")
    plan = partition(graph, devices, "balanced")
    first, second = plan.partitions
    live = live_costs(graph, plan, {first.name: 300e-6, second.name: 100e-6}, hops=NO_HOPS,
                      cache=cache)
    assert live.name == "live"
    again = partition(graph, devices, "balanced", costs=live)
    assert again.costs == "live"
    assert len(again.partitions[0].nodes) < len(first.nodes)


def test_the_default_is_measured_and_the_environment_or_caller_can_say_model(monkeypatch):
    monkeypatch.delenv(COSTS_ENV, raising=False)
    assert planning_module.default_costs() == "measured"
    monkeypatch.setenv(COSTS_ENV, "model")
    assert planning_module.checked_costs(None) == "model"
    assert planning_module.checked_costs("measured") == "measured"
    monkeypatch.setenv(COSTS_ENV, "fast")
    with pytest.raises(PrismError, match="PRISM_COSTS"):
        planning_module.default_costs()
    with pytest.raises(PrismError, match="costs must be one of"):
        planning_module.checked_costs("roofline")


def test_a_host_measures_by_default_and_says_so_on_the_bus(monkeypatch, tmp_path):
    monkeypatch.delenv(COSTS_ENV, raising=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:2")) as host:
        events = host.bus.subscribe(kinds=("cost.measure", "partition.planned"))
        plan = host.add_network("cnn", CNN)
        first = events.drain()
        assert plan.costs == "measured"
        assert any(e.kind == "cost.measure" for e in first)
        # checked under load after it loaded: the plan is published again, as corrected
        assert any("under load" in e.get("what", "") for e in first if e.kind == "cost.measure")
        planned = [e for e in first if e.kind == "partition.planned"][-1]
        assert planned.get("costs") == "measured"
        assert planned.get("lower_bound_seconds") == plan.lower_bound_seconds > 0
        again = host.add_network("cnn2", CNN)
        assert not [e for e in events.drain() if e.kind == "cost.measure"]  # cached
        assert again.costs == "measured"
        roof = host.add_network("cnn3", CNN, costs="model")
        assert roof.costs == "model"
        x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
        outs = [host.infer(n, {"image": x})["logits"] for n in ("cnn", "cnn2", "cnn3")]
        np.testing.assert_allclose(outs[0], outs[2], rtol=1e-5, atol=1e-5)


def test_a_network_taking_only_some_values_is_measured_on_one_requests_feeds(
        monkeypatch, tmp_path, caplog):
    """Made-up ids hold no end token, and this model fails on them: its costs stayed the
    roofline's however often it was loaded. Given one request's feeds, a load binds the
    free dimensions at their sizes and times the network on their values, under load too;
    feeds that do not fit are refused in one line, naming the input."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    ids = end_token_ids(np.random.default_rng())
    with HostManager(parse_devices("cpu:2")) as host, \
            caplog.at_level(logging.WARNING, logger=measure.__name__):
        assert host.add_network("made", end_token_model(), costs="measured").costs == "model"
        assert "on made-up inputs ids [1, 1]" in caplog.text
        caplog.clear()
        events = host.bus.subscribe(kinds=("cost.measure",))
        plan = host.add_network("given", end_token_model(), costs="measured",
                                sample_feeds={"ids": ids})
        assert plan.costs == "measured" and not caplog.records, caplog.text
        assert host.graph("given").tensors["ids"].shape == ids.shape
        assert any("under load" in e.get("what", "") for e in events.drain())
        np.testing.assert_array_equal(host.infer("given", {"ids": ids})["at"],
                                      [ids.shape[0] - 1, ids.shape[1] - 1])
        with pytest.raises(InvalidInputError, match=r"^sample_feeds: input 'ids' of bad: "):
            host.add_network("bad", end_token_model(), sample_feeds={"ids": ids * 0.5})
        assert host.networks() == ["made", "given"]


def test_replicas_auto_is_decided_on_the_costs_the_plan_is_made_with():
    """Non-twin devices (4 threads and 1): the roofline shares the work between them in
    a pipeline; measured (here: set so), the one-thread device is a hundred times slower,
    so the network stays whole on the other. `auto` follows the model it is given."""
    graph = load_graph(CNN)
    devices = [DeviceConfig(name="big", threads=4), DeviceConfig(name="small")]
    measured = CostModel(CostModel.roofline(graph).costs, {
        kind_of(d): Timings({n.name: per_node for n in graph.nodes}, 5e-6)
        for d, per_node in zip(devices, (2e-5, 2e-3), strict=True)}, {"cpu": 1e-5})

    def rate(plan) -> float:
        return 1 / plan.bottleneck_seconds

    for model in (CostModel.roofline(graph), measured):
        _, auto = plan_network(graph, devices, replicas="auto", costs=model)
        options = [partition(graph, devices[:k], "balanced", costs=model) for k in (1, 2)]
        assert rate(auto) == pytest.approx(max(rate(p) for p in options))
        assert auto.costs == model.name
    _, roofline = plan_network(graph, devices, replicas="auto", costs=CostModel.roofline(graph))
    _, timed = plan_network(graph, devices, replicas="auto", costs=measured)
    assert len({p.device for p in roofline.partitions}) == 2
    assert {p.device for p in timed.partitions} == {"big"}


def test_a_burst_under_load_counts_only_the_runtimes_own_wait():
    """What a burst sees beyond a GIL wait or a fifth more than the time alone is other
    work on the machine, not the network's cost; a faster run is believed."""
    from runtime.provision.calibrate import LOAD_SHARE_MAX, LOAD_WAIT_MAX, bounded

    assert bounded(100e-6, 130e-6) == pytest.approx(130e-6)  # a GIL wait: kept
    assert bounded(100e-6, 400e-6) == pytest.approx(100e-6 + LOAD_WAIT_MAX)
    assert bounded(10e-3, 20e-3) == pytest.approx(10e-3 * (1 + LOAD_SHARE_MAX))
    assert bounded(100e-6, 80e-6) == pytest.approx(80e-6)


def test_views_and_shape_reads_cost_no_copy_of_what_they_read():
    """onnxruntime aliases a view's output to its input (a Reshape of 64 MB took no time
    where a Neg of it took 3.4 ms), and a Shape or Size reads its input's shape alone: a
    Shape of a batch of 1,000 images was costed 24 ms, as a copy of them. What they read
    still counts as read, for memory."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    rows = int(np.random.default_rng().integers(1000, 5000))
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"], name="relu"),
         helper.make_node("Shape", ["h"], ["s"], name="shape"),
         helper.make_node("Size", ["h"], ["n"], name="size"),
         helper.make_node("Reshape", ["h", "flat"], ["r"], name="reshape"),
         helper.make_node("Unsqueeze", ["h", "axis"], ["u"], name="unsqueeze"),
         helper.make_node("Flatten", ["h"], ["l"], name="flatten")], "views",
        [helper.make_tensor_value_info("x", f, ["rows", 1024])],
        [*(helper.make_tensor_value_info(t, i64, None) for t in ("s", "n")),
         *(helper.make_tensor_value_info(t, f, None) for t in ("r", "u", "l"))],
        [numpy_helper.from_array(np.array([-1], np.int64), "flat"),
         numpy_helper.from_array(np.array([0], np.int64), "axis")]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = load_graph(model, bindings={"rows": rows})
    device = parse_devices("cpu:1")[0]
    costs = CostModel.roofline(graph)
    relu = costs.node_seconds("relu", device)
    for name, streamed in (("shape", 1), ("size", 1), ("reshape", 0), ("unsqueeze", 0),
                           ("flatten", 0)):
        cost = costs.costs[name]
        assert cost.bytes_read >= graph.tensors["h"].nbytes  # held while it is read
        seconds = costs.node_seconds(name, device)
        assert seconds == pytest.approx(device.launch_seconds + streamed * cost.bytes_written /
                                        device.mem_bandwidth) and seconds < relu / 10
