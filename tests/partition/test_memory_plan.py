"""Memory plans per device (issue 4): every activation tensor a device holds gets a storage
id, an offset and a size; tensors live at the same time never share bytes; tensors that
are not may, and do; the peak matches a brute-force count made here.

The reference below is written from the documented lifetimes, step by step over sets of
live tensors, without the planner's helpers: a device runs its partitions one after the
other in plan order, each node one step. In a partition, a tensor read from outside it
is live from the partition's first step (unless it is already on the device), a tensor
made there from its producer's step; it stays live to its last reader on the device, and
to the end of its partition if a node outside the partition reads it or it is a graph
output. A tensor is on a device once, however many of its partitions use it.
"""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from app.cli import main
from runtime import HostManager
from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import PartitionError
from runtime.graph import Graph, load_graph
from runtime.partition import Plan, partition
from runtime.partition.memory_plan import (
    DeviceMemoryPlan,
    MemoryEntry,
    device_memory_plan,
    memory_plans,
)
from runtime.partition.placement import can_run
from tests.support.dags import (
    SAMPLE_NAMES,
    SAMPLES_DIR,
    Rand,
    Reference,
    biggest_node,
    dag_models,
    producers,
    random_dag_model,
    random_devices,
    reads_of,
    sample_graph,
    total_bytes,
)

WIDTH = 64
UNIT = 4 * WIDTH  # bytes of one [1, 64] float tensor


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")  # rich must not wrap the lines we read


# --------------------------------------------------------------------------------------
# the reference: lifetimes and the peak by brute force
# --------------------------------------------------------------------------------------
def brute_force(plan: Plan, graph: Graph, device: str
                ) -> tuple[dict[str, set[int]], dict[str, set[str]], int]:
    """(tensor -> steps it is live on the device, tensor -> partitions using it, peak)."""
    weights = set(graph.initializers)
    outputs = set(graph.outputs)
    made_by = producers(graph)
    steps: list[tuple[str, str]] = []  # (partition, node) per step
    for p in plan.partitions:
        if p.device == device:
            steps += [(p.name, n) for n in p.nodes]
    first_step = {}
    last_step = {}
    for i, (part, _) in enumerate(steps):
        first_step.setdefault(part, i)
        last_step[part] = i
    members = {p.name: set(p.nodes) for p in plan.partitions}
    step_of = {node: i for i, (_, node) in enumerate(steps)}
    touched: dict[str, set[int]] = {}  # tensor -> steps it must be resident at
    users: dict[str, set[str]] = {}
    for i, (part, node_name) in enumerate(steps):
        node = graph.node(node_name)
        for t in reads_of(node):
            if t in weights:
                continue
            users.setdefault(t, set()).add(part)
            maker = made_by.get(t)
            arrives = step_of[maker] if maker in step_of else first_step[part]
            touched.setdefault(t, set()).update({arrives, i})
        for t in node.outputs:
            if not t:
                continue
            users.setdefault(t, set()).add(part)
            readers = {n.name for n in graph.nodes if t in reads_of(n)}
            leaves = t in outputs or bool(readers - members[part])
            touched.setdefault(t, set()).update({i, last_step[part] if leaves else i})
    live = {t: set(range(min(s), max(s) + 1)) for t, s in touched.items()}
    per_step = [sum(graph.tensor_bytes(t) for t, s in live.items() if i in s)
                for i in range(len(steps))]
    return live, users, max(per_step, default=0)


def activation_tensors(plan: Plan, graph: Graph, device: str) -> set[str]:
    """Every non-weight tensor a node of one of the device's partitions reads or writes."""
    out = set()
    for p in plan.partitions:
        if p.device == device:
            for n in p.nodes:
                node = graph.node(n)
                out |= {t for t in (*reads_of(node), *node.outputs)
                        if t and t not in graph.initializers}
    return out


def check_memory_plans(plan: Plan, graph: Graph, plans: dict[str, DeviceMemoryPlan], *,
                       alignment: int = 1) -> None:
    assert set(plans) == {d.name for d in plan.devices}
    for device, mp in plans.items():
        assert mp.device == device
        tensors = [e.tensor for e in mp.entries]
        assert len(tensors) == len(set(tensors)), "a tensor appears once per device"
        assert set(tensors) == activation_tensors(plan, graph, device)
        live, users, peak = brute_force(plan, graph, device)
        assert set(live) == set(tensors)
        for e in mp.entries:
            assert e.size == graph.tensor_bytes(e.tensor)
            assert set(range(e.start, e.end + 1)) == live[e.tensor], e
            assert set(e.partitions) == users[e.tensor]
            order = [p.name for p in plan.partitions]
            assert list(e.partitions) == sorted(e.partitions, key=order.index)
            assert e.partition == e.partitions[0]
            assert e.offset % alignment == 0 and e.offset >= 0
        assert mp.peak_bytes == peak
        assert mp.arena_bytes == max((e.offset + e.size for e in mp.entries), default=0)
        assert mp.arena_bytes >= mp.peak_bytes
        assert alignment > 1 or mp.total_tensor_bytes >= mp.arena_bytes
        assert mp.steps == sum(len(p.nodes) for p in plan.partitions if p.device == device)
        # tensors live at the same time never share a byte
        for i, a in enumerate(mp.entries):
            for b in mp.entries[i + 1:]:
                if a.size and b.size and a.overlaps_in_time(b):
                    assert not a.overlaps_in_memory(b), (a, b)
        # one storage id per distinct (offset, size) block
        blocks: dict[int, tuple[int, int]] = {}
        for e in mp.entries:
            assert blocks.setdefault(e.storage_id, (e.offset, e.size)) == (e.offset, e.size)
        assert len(set(blocks.values())) == len(blocks)
        assert json.loads(json.dumps(mp.to_dict()))["peak_bytes"] == mp.peak_bytes


def roomy(devices: list[DeviceConfig]) -> list[DeviceConfig]:
    return [DeviceConfig(**{**d.to_dict(), "memory_bytes": 1 << 30}) for d in devices]


def random_notes(r: Rand, graph: Graph, devices: list[DeviceConfig]) -> dict:
    """Node annotations to random capable devices: partitions interleave on devices."""
    nodes = {}
    for node in graph.nodes:
        able = [d.name for d in devices if can_run(d, node)]
        if able and r.chance(0.5):
            nodes[node.name] = r.choice(able)
    return {"nodes": nodes}


def plan_for(graph: Graph, devices: list[DeviceConfig], mode: str, notes=None) -> Plan | None:
    try:
        return partition(graph, devices, mode, annotations=notes)
    except PartitionError:
        return None


# --------------------------------------------------------------------------------------
# hand-built graphs
# --------------------------------------------------------------------------------------
def make_model(nodes: list[tuple], outputs: list[str], *,
               widths: dict[str, int] | None = None) -> onnx.ModelProto:
    """(name, op, inputs, outputs[, attributes]) nodes over [1, width] float tensors."""
    widths = widths or {}
    made = [helper.make_node(op, ins, outs, name=name, **(rest[0] if rest else {}))
            for name, op, ins, outs, *rest in nodes]
    graph = helper.make_graph(
        made, "handmade",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, widths.get("x", WIDTH)])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, widths.get(t, WIDTH)])
         for t in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def chain(n: int) -> Graph:
    ops = ("Relu", "Neg", "Tanh", "Abs")
    nodes = [(f"n{i}", ops[i % 4], ["x" if i == 0 else f"t{i - 1}"], [f"t{i}"])
             for i in range(n)]
    return load_graph(make_model(nodes, [f"t{n - 1}"]), name="chain")


def cpu(name: str) -> DeviceConfig:
    return DeviceConfig(name=name)


def test_a_chain_of_equal_tensors_reuses_two_blocks():
    graph = chain(12)
    plan = partition(graph, [cpu("cpu0")], "memory")
    (mp,) = memory_plans(plan, graph).values()
    check_memory_plans(plan, graph, memory_plans(plan, graph))
    assert len(mp.entries) == 13 and mp.total_tensor_bytes == 13 * UNIT
    assert mp.peak_bytes == mp.arena_bytes == 2 * UNIT  # a node's input and output
    assert mp.storage_blocks == 2
    assert {e.offset for e in mp.entries} == {0, UNIT}
    # neighbours alternate between the two blocks
    by_start = sorted(mp.entries, key=lambda e: e.start)
    assert all(a.storage_id != b.storage_id for a, b in itertools.pairwise(by_start))


def test_a_long_lived_tensor_keeps_its_block_while_others_reuse_theirs():
    # x -> a -> b -> c -> d, and e = Add(a, d): a stays live from step 0 to step 4.
    graph = load_graph(make_model(
        [("na", "Relu", ["x"], ["a"]), ("nb", "Neg", ["a"], ["b"]),
         ("nc", "Tanh", ["b"], ["c"]), ("nd", "Abs", ["c"], ["d"]),
         ("ne", "Add", ["a", "d"], ["e"])], ["e"]), name="skip")
    plan = partition(graph, [cpu("cpu0")], "memory")
    mp = memory_plans(plan, graph)["cpu0"]
    check_memory_plans(plan, graph, memory_plans(plan, graph))
    a = mp.entry("a")
    assert (a.start, a.end) == (0, 4)
    assert mp.peak_bytes == mp.arena_bytes == 3 * UNIT
    others = [e for e in mp.entries if e.tensor != "a"]
    assert all(e.storage_id != a.storage_id for e in others)
    assert len({e.storage_id for e in others}) == 2


def test_a_bigger_tensor_and_smaller_ones_share_its_bytes_later():
    # x(64) -> w (256 wide) -> s (64) -> t (64) -> u (64): once w is dead, its bytes are
    # free for t and u.
    graph = load_graph(make_model(
        [("nw", "Concat", ["x", "x", "x", "x"], ["w"], {"axis": -1}),
         ("ns", "Sigmoid", ["w"], ["s"]), ("nr", "ReduceMax", ["s"], ["m"], {"axes": [1]}),
         ("nt", "Relu", ["m"], ["t"]), ("nu", "Neg", ["t"], ["u"]),
         ("nv", "Abs", ["u"], ["v"])], ["v"],
        widths={"w": 4 * WIDTH, "s": 4 * WIDTH, "m": 1, "t": 1, "u": 1, "v": 1}),
        name="shrink")
    plan = partition(graph, [cpu("cpu0")], "memory")
    mp = memory_plans(plan, graph)["cpu0"]
    check_memory_plans(plan, graph, memory_plans(plan, graph))
    assert mp.peak_bytes == mp.arena_bytes == 8 * UNIT  # w and s, live together at ns
    w, s = mp.entry("w"), mp.entry("s")
    small = [mp.entry(t) for t in ("m", "t", "u", "v")]
    assert all(e.size == 4 for e in small)
    # the small tensors sit in bytes w (dead after ns) or s (dead after nr) held before
    assert all(e.offset + e.size <= max(w.offset + w.size, s.offset + s.size) for e in small)
    assert mp.storage_blocks < len(mp.entries)


def test_a_tensor_resident_between_a_devices_partitions_is_planned_once():
    # r on cpu0 makes t0; s on cpu1; n and a on cpu0 again, a reads t0: t0 stays on cpu0
    # from r to a, one entry naming both cpu0 partitions. On cpu1 it is an input.
    graph = load_graph(make_model(
        [("r", "Relu", ["x"], ["t0"]), ("s", "Sigmoid", ["t0"], ["t1"]),
         ("n", "Neg", ["t1"], ["t2"]), ("a", "Add", ["t0", "t2"], ["y"])], ["y"]),
        name="resident")
    where = {"r": "cpu0", "s": "cpu1", "n": "cpu0", "a": "cpu0"}
    for mode in ("memory", "balanced"):
        plan = partition(graph, [cpu("cpu0"), cpu("cpu1")], mode, annotations={"nodes": where})
        plans = memory_plans(plan, graph)
        check_memory_plans(plan, graph, plans)
        t0 = plans["cpu0"].entry("t0")
        first, second = (p.name for p in plan.partitions if p.device == "cpu0")
        assert t0.partitions == (first, second) and t0.partition == first
        assert (t0.start, t0.end) == (0, 2)  # r is step 0; n, a are steps 1, 2
        assert plans["cpu1"].entry("t0").partitions == (plan.partition_of("s").name,)
        assert [e.tensor for e in plans["cpu1"].entries] == ["t0", "t1"]


def middle_graph() -> tuple[Graph, dict[str, str]]:
    """t0 made on cpu0 waits there while cpu0 runs a partition with three live tensors."""
    graph = load_graph(make_model(
        [("r", "Relu", ["x"], ["t0"]), ("s", "Sigmoid", ["t0"], ["t1"]),
         ("u", "Neg", ["t1"], ["t2"]), ("v", "Tanh", ["t2"], ["t3"]),
         ("z", "Add", ["t2", "t3"], ["t5"]), ("q", "Abs", ["t5"], ["t4"]),
         ("w", "Add", ["t4", "t0"], ["y"])], ["y"]), name="middle")
    where = {"r": "cpu0", "s": "cpu1", "u": "cpu0", "v": "cpu0", "z": "cpu0", "q": "cpu1",
             "w": "cpu0"}
    return graph, where


def test_a_waiting_tensor_adds_to_the_peak_of_the_partitions_it_waits_through():
    graph, where = middle_graph()
    plan = partition(graph, [cpu("cpu0"), cpu("cpu1")], "balanced", annotations={"nodes": where})
    assert [p.device for p in plan.partitions] == ["cpu0", "cpu1", "cpu0", "cpu1", "cpu0"]
    mp = memory_plans(plan, graph)["cpu0"]
    check_memory_plans(plan, graph, memory_plans(plan, graph))
    assert mp.peak_bytes == 4 * UNIT  # at z: t0 waiting, t2, t3 and t5
    assert max(p.activation_bytes for p in plan.partitions if p.device == "cpu0") == 3 * UNIT


def test_device_memory_covers_the_memory_plans_peak():
    graph, where = middle_graph()
    plan = partition(graph, [cpu("cpu0"), cpu("cpu1")], "balanced", annotations={"nodes": where})
    mp = memory_plans(plan, graph)["cpu0"]
    weights = sum(p.weight_bytes for p in plan.partitions if p.device == "cpu0")
    assert plan.device_memory()["cpu0"] >= weights + mp.peak_bytes


@pytest.mark.parametrize("memory", [1000, 1100])
def test_a_plan_that_partitions_also_provisions(memory):
    # cpu0 holds three partitions with 2, 3 and 3 tensors of 256 B at their peaks; its
    # memory plan's peak is 4 tensors (1024 B). Partitioning and loading must agree.
    graph, where = middle_graph()
    devices = [DeviceConfig(name="cpu0", memory_bytes=memory), cpu("cpu1")]
    try:
        partition(graph, devices, "balanced", annotations={"nodes": where})
    except PartitionError:
        return  # refused up front: consistent
    with HostManager(devices) as host:
        host.add_network("middle", graph.model, annotations={"nodes": where})


def test_alignment_rounds_offsets_up_and_keeps_tensors_apart():
    graph = load_graph(random_dag_model(np.random.default_rng(), 25))
    plan = partition(graph, parse_devices("cpu:2"), "balanced")
    plans = memory_plans(plan, graph, alignment=64)
    check_memory_plans(plan, graph, plans, alignment=64)
    with pytest.raises(ValueError, match="alignment"):
        device_memory_plan(plan, graph, "cpu0", alignment=0)


def test_an_idle_device_has_an_empty_plan_and_to_dict_is_json():
    graph = chain(3)
    plan = partition(graph, parse_devices("cpu:3"), "memory")
    plans = memory_plans(plan, graph)
    idle = [mp for mp in plans.values() if not mp.entries]
    assert len(idle) == 2
    assert all(mp.peak_bytes == mp.arena_bytes == mp.steps == 0 for mp in idle)
    data = json.loads(json.dumps({d: mp.to_dict() for d, mp in plans.items()}))
    busy = data[plan.partitions[0].device]
    assert busy["peak_bytes"] == 2 * UNIT and len(busy["entries"]) == 4
    assert set(busy["entries"][0]) == {"tensor", "partition", "storage_id", "offset", "size",
                                       "start", "end", "partitions"}
    assert busy["partition_steps"] == {plan.partitions[0].name: [0, 2]}
    assert MemoryEntry(**{**busy["entries"][0], "partitions": tuple(
        busy["entries"][0]["partitions"])}) == plans[plan.partitions[0].device].entries[0]


# --------------------------------------------------------------------------------------
# random graphs and the samples
# --------------------------------------------------------------------------------------
@settings(max_examples=40)
@given(data=st.data())
def test_random_dag_memory_plans(data):
    graph = load_graph(data.draw(dag_models(3, 40)))
    r = Rand(data.draw)
    ops = sorted({n.op_type for n in graph.nodes})
    devices = random_devices(r, total_bytes(graph), ops=ops, floor=biggest_node(graph))
    notes = random_notes(r, graph, roomy(devices)) if r.chance(0.5) else None
    devices = roomy(devices) if notes else devices
    for mode in ("memory", "balanced"):
        plan = plan_for(graph, devices, mode, notes)
        if plan is not None:
            check_memory_plans(plan, graph, memory_plans(plan, graph))


@settings(max_examples=15)
@given(name=st.sampled_from(SAMPLE_NAMES), data=st.data())
def test_sample_memory_plans(name, data):
    graph = sample_graph(name)
    r = Rand(data.draw)
    ops = sorted({n.op_type for n in graph.nodes})
    devices = roomy(random_devices(r, total_bytes(graph), ops=ops, max_devices=5))
    notes = random_notes(r, graph, devices) if r.chance(0.5) else None
    plan = plan_for(graph, devices, r.choice(("memory", "balanced")), notes)
    if plan is not None:
        check_memory_plans(plan, graph, memory_plans(plan, graph))


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_one_device_peak_is_the_partitions_activation_peak(name):
    """One device, one partition: the peak is the reference's peak live activations and
    the partition's activation_bytes; first fit reaches it on the samples."""
    graph = sample_graph(name)
    plan = partition(graph, parse_devices("cpu:1"), "memory")
    (part,) = plan.partitions
    mp = memory_plans(plan, graph)["cpu0"]
    check_memory_plans(plan, graph, memory_plans(plan, graph))
    assert mp.peak_bytes == Reference(graph).activation_bytes(part.nodes) == part.activation_bytes
    assert mp.arena_bytes == mp.peak_bytes
    assert mp.storage_blocks < len(mp.entries)


def test_seeded_random_graphs_on_one_device_reuse_memory():
    rng = np.random.default_rng()
    for _ in range(10):
        graph = load_graph(random_dag_model(Rand(rng), int(rng.integers(10, 60))))
        plan = partition(graph, parse_devices("cpu:1"), "memory")
        mp = memory_plans(plan, graph)["cpu0"]
        check_memory_plans(plan, graph, memory_plans(plan, graph))
        assert mp.peak_bytes == Reference(graph).activation_bytes(plan.partitions[0].nodes)
        assert mp.arena_bytes <= 1.5 * mp.peak_bytes  # first fit stays near the peak
        if mp.total_tensor_bytes > 1.5 * mp.peak_bytes:  # so reuse is forced
            assert mp.arena_bytes < mp.total_tensor_bytes
            assert any(a.size and b.size and a.overlaps_in_memory(b)
                       for a, b in itertools.combinations(mp.entries, 2))


# --------------------------------------------------------------------------------------
# prism partition --memory-plan
# --------------------------------------------------------------------------------------
def test_cli_memory_plan_prints_a_table_per_device_and_the_peaks(capsys):
    path = str(SAMPLES_DIR / "cnn.onnx")
    assert main(["partition", path, "--devices", "cpu:2,sim:1", "--memory-plan"]) == 0
    out, err = capsys.readouterr()
    assert not err
    graph = load_graph(path, name="cnn")
    plan = partition(graph, parse_devices("cpu:2,sim:1"), "balanced")
    plans = memory_plans(plan, graph)
    for device, mp in plans.items():
        if not mp.entries:
            continue
        assert re.search(rf"memory plan {device}\b", out), device
        for e in mp.entries:
            assert re.search(
                rf"^\s*{re.escape(e.tensor)}\s+{re.escape(','.join(e.partitions))}\s+"
                rf"{e.storage_id}\s+{e.offset}\s+{e.size}\s+{e.start}\s+{e.end}\s*$", out,
                re.MULTILINE), e
    assert "activation memory per device" in out
    for device, mp in plans.items():
        assert re.search(rf"^\s*{device}\s+{len(mp.entries)}\s+{mp.storage_blocks}\s+"
                         rf"{mp.peak_bytes}\s+{mp.arena_bytes}\s+{mp.total_tensor_bytes}\s*$",
                         out, re.MULTILINE), device


def test_cli_memory_plan_in_json_and_absent_without_the_flag(capsys):
    path = str(SAMPLES_DIR / "mlp.onnx")
    assert main(["partition", path, "--devices", "cpu:2", "--json", "--memory-plan"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["memory_plans"]) == {"cpu0", "cpu1"}
    assert all(mp["peak_bytes"] <= mp["arena_bytes"] for mp in data["memory_plans"].values())
    assert main(["partition", path, "--devices", "cpu:2"]) == 0
    assert "memory plan cpu" not in capsys.readouterr().out
    assert main(["partition", path, "--devices", "cpu:2", "--json"]) == 0
    assert "memory_plans" not in json.loads(capsys.readouterr().out)
