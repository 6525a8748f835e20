"""The lower bound every plan carries: no assignment of nodes to devices beats it (checked
against every assignment of small graphs), it is in the plan's JSON and the stepper, and a
device balanced leaves idle gets a step saying why."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime.bundle.plan_io import plan_from_dict
from runtime.cost import CostModel, Timings, kind_of
from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import PartitionError
from runtime.graph import load_graph
from runtime.partition import partition, partition_steps
from runtime.partition.bound import lower_bound
from runtime.partition.build import build_plan
from runtime.partition.partitioner import IDLE_SEARCH
from runtime.partition.placement import Annotations, place
from runtime.partition.steps import STEP_KINDS
from runtime.units import human_seconds
from tests.support.dags import SAMPLES_DIR, collect, random_dag_model


def _best_of_every_assignment(graph, devices, model, allowed=None) -> float:
    """The least bottleneck over every assignment of nodes to devices (one partition per
    device used, each node on a device `allowed` lets it run on) whose partitions do not
    depend on each other in a cycle."""
    names = [n.name for n in graph.nodes]
    order = list(names)
    best = np.inf
    for choice in itertools.product(range(len(devices)), repeat=len(names)):
        if allowed and any(devices[c].name not in allowed[n]
                           for n, c in zip(names, choice, strict=True)):
            continue
        groups = [(f"p{d}", devices[d].name, [n for n, c in zip(names, choice, strict=True)
                                              if c == d]) for d in range(len(devices))]
        try:
            plan = build_plan(graph, model, devices, [g for g in groups if g[2]],
                              mode="user", order=order)
        except PartitionError:
            continue  # partitions in a cycle: not a plan
        best = min(best, plan.bottleneck_seconds)
    return best


def _measured_model(graph, devices, rng) -> CostModel:
    """Node times, run costs and hops drawn at random, for the devices' measured kinds."""
    timings = {kind_of(d): Timings({n.name: float(rng.uniform(1e-6, 1e-4))
                                    for n in graph.nodes}, float(rng.uniform(0, 2e-5)))
               for d in devices if kind_of(d)}
    return CostModel(CostModel.roofline(graph).costs, timings,
                     {"cpu": float(rng.uniform(0, 5e-5))})


@pytest.mark.parametrize("seed", range(12))
def test_no_assignment_of_a_small_graph_beats_the_bound(seed):
    rng = np.random.default_rng(seed)
    graph = load_graph(random_dag_model(seed, int(rng.integers(2, 6)), max_width=16))
    devices = [DeviceConfig(name="cpu0"), DeviceConfig(name="cpu1", threads=2),
               DeviceConfig(name="sim0", backend="sim", link_bandwidth=1e9)]
    devices = devices[: int(rng.integers(2, 4))]
    for model in (CostModel.roofline(graph), _measured_model(graph, devices, rng)):
        bound = lower_bound(graph, model, devices)
        best = _best_of_every_assignment(graph, devices, model)
        assert bound.seconds <= best * (1 + 1e-9), (bound, best)
        plan = partition(graph, devices, "balanced", costs=model)
        assert plan.lower_bound_seconds == pytest.approx(bound.seconds)
        assert plan.bottleneck_seconds >= plan.lower_bound_seconds * (1 - 1e-9)
        assert plan.gap >= -1e-9


@pytest.mark.parametrize("seed", range(10))
def test_no_assignment_over_op_limited_devices_beats_the_bound(seed):
    """Accelerators that lack some of the graph's ops confine those nodes to the cpus:
    the bound counts their work over the cpus alone, and still no assignment beats it."""
    rng = np.random.default_rng(seed)
    graph = load_graph(random_dag_model(seed, int(rng.integers(3, 6)), max_width=16))
    ops = sorted({n.op_type for n in graph.nodes})
    kept = frozenset(rng.choice(ops, size=max(1, len(ops) // 2), replace=False).tolist())
    devices = [DeviceConfig(name="cpu0"), DeviceConfig(name="cpu1"),
               DeviceConfig(name="sim0", backend="sim", supported_ops=kept,
                            peak_flops=float(rng.choice([1e9, 1e11])), link_bandwidth=1e9)]
    allowed = place(graph, devices, Annotations()).allowed
    for model in (CostModel.roofline(graph), _measured_model(graph, devices, rng)):
        bound = lower_bound(graph, model, devices, allowed)
        best = _best_of_every_assignment(graph, devices, model, allowed)
        assert bound.seconds <= best * (1 + 1e-9), (bound, best)


def test_work_only_the_cpus_may_run_lifts_the_bound():
    """The transformer's normalisations, softmaxes and reshapes run only on the cpus: the
    bound counts them over two devices, not six, and says so."""
    graph = load_graph(SAMPLES_DIR / "transformer.onnx")
    devices = parse_devices("cpu:2,sim:4:mem=2MB:ops=Conv+Gemm+MatMul+Relu+Add")
    allowed = place(graph, devices, Annotations()).allowed
    model = CostModel.roofline(graph)
    bound = lower_bound(graph, model, devices, allowed)
    assert bound.confined_to == ("cpu0", "cpu1") and bound.confined > bound.work
    assert bound.seconds == pytest.approx(max(bound.confined, bound.largest))
    assert "work only cpu0, cpu1 may run" in bound.why()
    plan = partition(graph, devices, "balanced", costs=model)
    assert plan.lower_bound_seconds == pytest.approx(bound.seconds)
    assert plan.bottleneck_seconds >= bound.seconds


@pytest.mark.parametrize("made", [False, True])
def test_branches_that_split_without_a_copy_do_not_lift_the_bound(made):
    """Two chains that share only the graph input (`made`: and a weight made from weights
    alone, which a partition reading it makes itself): a split puts one on each device and
    copies nothing, so the bound may not charge a copy (it did, and rose above the plan)."""
    rng = np.random.default_rng()
    nodes, weights = [], []
    for chain in "ab":
        last = "x"
        for i in range(2):
            weights.append(numpy_helper.from_array(
                rng.standard_normal((64, 64)).astype(np.float32), f"w{chain}{i}"))
            nodes.append(helper.make_node("MatMul", [last, f"w{chain}{i}"], [f"{chain}{i}"],
                                          name=f"mm{chain}{i}"))
            last = f"{chain}{i}"
    if made:  # both chains' first weight, made by a node (left unfolded below)
        weights = [w for w in weights if w.name not in ("wa0", "wb0")] + [
            numpy_helper.from_array(np.array([64, 64], np.int64), "shape")]
        nodes.insert(0, helper.make_node("ConstantOfShape", ["shape"], ["w0"], name="fill",
                                         value=numpy_helper.from_array(np.ones(1, np.float32))))
        for node in nodes:
            node.input[:] = ["w0" if t in ("wa0", "wb0") else t for t in node.input]
    model = helper.make_model(helper.make_graph(
        nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
        [helper.make_tensor_value_info(f"{c}1", TensorProto.FLOAT, [32, 64]) for c in "ab"],
        weights), opset_imports=[helper.make_opsetid("", 17)])
    graph = load_graph(model, fold=not made)
    devices = parse_devices("sim:2")
    roofline = CostModel.roofline(graph)
    bound = lower_bound(graph, roofline, devices)
    assert bound.seconds <= _best_of_every_assignment(graph, devices, roofline) * (1 + 1e-9)
    plan = partition(graph, devices, "balanced", costs=roofline)
    assert not plan.transfers and plan.gap >= -1e-9


def test_one_device_is_its_own_bound():
    graph = load_graph(SAMPLES_DIR / "cnn.onnx")
    plan = partition(graph, parse_devices("cpu:1"), "balanced")
    assert plan.lower_bound_seconds == pytest.approx(plan.bottleneck_seconds)
    assert plan.gap == pytest.approx(0.0, abs=1e-9)


def test_the_bound_is_in_the_json_the_round_trip_and_the_steps():
    graph = load_graph(SAMPLES_DIR / "transformer.onnx")
    steps, plan = collect(partition_steps(graph, parse_devices("cpu:2"), "balanced"))
    data = json.loads(plan.to_json())
    assert data["lower_bound_seconds"] == plan.lower_bound_seconds > 0
    assert data["costs"] == "model"
    assert plan_from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    bound = next(s for s in steps if s.kind == "bound")
    assert "beats" in bound.reason and "gap" in bound.reason
    assert steps[-1].kind == "planned" and "lower bound" in steps[-1].reason
    assert {"bound", "idle"} <= set(STEP_KINDS)


def test_a_device_balanced_leaves_idle_gets_a_step_saying_why():
    """Two devices behind a slow link: every copy costs more than the work it would
    spread, so balanced keeps the network on one and says why the other has none."""
    slow = [DeviceConfig(name=f"sim{i}", backend="sim", link_latency=0.05) for i in range(2)]
    graph = load_graph(SAMPLES_DIR / "mlp.onnx")
    steps, plan = collect(partition_steps(graph, slow, "balanced"))
    [used] = {p.device for p in plan.partitions}
    [other] = {"sim0", "sim1"} - {used}
    idle = [s for s in steps if s.kind == "idle"]
    assert [s.device for s in idle] == [other]
    assert f"{other} left idle" in idle[0].reason and "slowest stage" in idle[0].reason
    assert plan.lower_bound_seconds == pytest.approx(plan.bottleneck_seconds)  # optimal
    busy = [DeviceConfig(name=f"sim{i}", backend="sim") for i in range(2)]
    steps, plan = collect(partition_steps(graph, busy, "balanced"))
    assert len(plan.partitions) == 2 and not [s for s in steps if s.kind == "idle"]


def test_an_idle_step_searches_splits_using_every_device_up_to_twice_the_plan():
    """Past IDLE_SEARCH times the plan's bottleneck the search stops (unbounded, it was
    quadratic in the nodes) and the step says so."""
    graph = load_graph(SAMPLES_DIR / "mlp.onnx")
    for latency, exact in ((1e-3, False), (1e-4, True)):
        slow = [DeviceConfig(name=f"sim{i}", backend="sim", link_latency=latency)
                for i in range(2)]
        steps, plan = collect(partition_steps(graph, slow, "balanced"))
        [idle] = [s for s in steps if s.kind == "idle"]
        bounded = f"under {human_seconds(IDLE_SEARCH * plan.bottleneck_seconds)}"
        assert ("the best split's slowest stage is" in idle.reason) is exact, idle.reason
        assert (bounded in idle.reason) is not exact, idle.reason
