"""Properties of every plan the partitioner makes, checked against independent figures.

Random DAGs and the sample models, modes memory and balanced on 1..8 mixed devices (memory
often tight), and user maps. A PartitionError is only accepted when the reference says no
plan exists.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from runtime.cost import CostModel
from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import PartitionError
from runtime.graph import Graph, load_graph
from runtime.partition import (
    MODES,
    Plan,
    canonical_devices,
    partition,
    partition_steps,
    replay,
)
from runtime.partition.build import build_plan
from runtime.partition.greedy import fill, rebalance
from runtime.partition.liveness import StretchMemory, peak_activation_bytes, weight_bytes
from runtime.partition.memory_plan import device_peak_bytes
from runtime.partition.placement import place, read_annotations
from runtime.partition.record import Recorder, finish, tap
from runtime.partition.regions import STYLES, _Part, placement_order, region_split
from runtime.partition.segments import Segments
from runtime.partition.steps import STEP_KINDS
from tests.partition.test_memory_plan import brute_force
from tests.support.dags import (
    SAMPLE_NAMES,
    Rand,
    Reference,
    biggest_node,
    close,
    dag_models,
    device_lists,
    distinct_orderings,
    matmul_chain,
    random_dag_model,
    random_devices,
    reads_of,
    sample_graph,
    total_bytes,
)
from tests.support.weights import made_weights


def groups(plan: Plan) -> set[tuple[frozenset, str]]:
    return {(frozenset(p.nodes), p.device) for p in plan.partitions}


def capability(device: DeviceConfig) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in device.to_dict().items() if k != "name"))


def run_collecting(gen) -> tuple[list, Plan | None, PartitionError | None]:
    """Every step yielded, then the plan, or the PartitionError raised part way."""
    steps = []
    try:
        while True:
            steps.append(next(gen))
    except StopIteration as stop:
        return steps, stop.value, None
    except PartitionError as exc:
        return steps, None, exc


def device_times(ref: Reference, graph: Graph, plan: Plan) -> dict[str, float]:
    """Per device: compute of its nodes plus its end of each copy: one per activation it
    reads that another device made, one per activation it makes that another reads."""
    device_of = {n: p.device for p in plan.partitions for n in p.nodes}
    by_name = {d.name: d for d in plan.devices}
    times = dict.fromkeys(by_name, 0.0)
    for dev in by_name:
        names = [n for n in plan.order if device_of[n] == dev]
        times[dev] = ref.seconds(names, by_name[dev])
    return times


def check_plan(graph: Graph, devices: list[DeviceConfig], mode: str, plan: Plan,
               steps: list) -> None:
    ref = Reference(graph)
    all_nodes = [n.name for n in graph.nodes]
    by_name = {d.name: d for d in devices}

    # The order is a topological order of every node.
    assert sorted(plan.order) == sorted(all_nodes)
    position = {n: i for i, n in enumerate(plan.order)}
    assert all(position[a] < position[b] for a, b in graph.dag.edges)

    # Every node in exactly one partition; nodes listed in plan order.
    counts = Counter(n for p in plan.partitions for n in p.nodes)
    assert set(counts) == set(all_nodes) and set(counts.values()) == {1}
    for p in plan.partitions:
        assert p.nodes, f"empty partition {p.name}"
        assert [position[n] for n in p.nodes] == sorted(position[n] for n in p.nodes)
    assert len({p.name for p in plan.partitions}) == len(plan.partitions)

    # Partitions in topological order: none reads what a later one makes.
    home = {n: i for i, p in enumerate(plan.partitions) for n in p.nodes}
    for i, p in enumerate(plan.partitions):
        for n in p.nodes:
            for t in reads_of(graph.node(n)):
                if t in ref.made_by:
                    assert home[ref.made_by[t]] <= i, (p.name, n, t)

    # Devices can run their nodes; memory per device within its capacity.
    weights = dict.fromkeys(by_name, 0)
    for p in plan.partitions:
        dev = by_name[p.device]
        assert p.backend == dev.backend
        assert ref.runs(p.nodes, dev), (p.name, p.device)
        assert p.weight_bytes == ref.weight_bytes(p.nodes), p.name
        assert p.activation_bytes == ref.activation_bytes(p.nodes), p.name
        weights[p.device] += p.weight_bytes
        inside = set(p.nodes)
        reads = {t for n in p.nodes for t in reads_of(graph.node(n))}
        made = {t for n in p.nodes for t in graph.node(n).outputs if t}
        assert set(p.inputs) == {t for t in reads - made if t not in graph.initializers}
        assert set(p.outputs) == {t for t in made if t in graph.outputs
                                  or ref.readers.get(t, set()) - inside}
        assert set(p.weights) == {t for t in reads if t in graph.initializers}
    # A device runs one partition at a time: one arena suffices, the most bytes live at
    # once on its timeline, a tensor waiting between two of its partitions included.
    arena = {name: brute_force(plan, graph, name)[2] for name in by_name}
    used = {name: weights[name] + arena[name] for name in by_name}
    for name, nbytes in used.items():
        assert nbytes <= by_name[name].memory_bytes, (name, nbytes)
    assert plan.device_memory() == used

    # Times: per device, and the bottleneck.
    times = device_times(ref, graph, plan)
    for name, t in times.items():
        assert close(plan.device_seconds[name], t), (name, plan.device_seconds[name], t)
    assert close(plan.bottleneck_seconds, max(times.values())), (plan.bottleneck_seconds, times)

    # Transfers: one per (tensor, reading device other than the producer's).
    device_of = {n: p.device for p in plan.partitions for n in p.nodes}
    expected = set()
    for n in graph.nodes:
        for t in reads_of(n):
            src = ref.made_by.get(t)
            if src is not None and device_of[src] != device_of[n.name]:
                expected.add((t, device_of[src], device_of[n.name], ref.size(t)))
    got = [(x.tensor, x.src, x.dst, x.bytes) for x in plan.transfers]
    assert len(got) == len(set(got)) and set(got) == expected

    if mode in ("memory", "balanced"):
        # A split of the order into contiguous segments, each on a device of its own;
        # each segment's time is its compute plus its copies in and out. Where placement
        # interleaves devices, a device may hold several segments.
        assert [n for p in plan.partitions for n in p.nodes] == list(plan.order)
        on = [p.device for p in plan.partitions]
        if len(on) == len(set(on)):
            seg = [ref.seconds(p.nodes, by_name[p.device]) for p in plan.partitions]
            for p, t in zip(plan.partitions, seg, strict=True):
                assert close(p.stage_seconds,
                             t), p.name
            assert close(plan.bottleneck_seconds, max(seg))

    # Steps: numbered 0..N-1, known kinds, order first, planned last, and replayable.
    assert [s.index for s in steps] == list(range(len(steps)))
    assert {s.kind for s in steps} <= set(STEP_KINDS)
    assert all(s.kind == "place" for s in steps[: len(graph.nodes)])  # placement first
    assert steps[len(graph.nodes)].kind == "order"
    assert tuple([s for s in steps if s.kind == "order"][-1].nodes) == tuple(plan.order)
    assert steps[-1].kind == "planned"
    assert sum(s.kind == "planned" for s in steps) == 1
    state = replay(steps)
    assert tuple(state.order) == tuple(plan.order)
    replayed: dict[int, set] = {}
    for node, part in state.assignment.items():
        replayed.setdefault(part, set()).add(node)
    assert {(frozenset(m), state.devices[i]) for i, m in replayed.items()} == groups(plan)
    # Replaying a prefix never assigns a node the full replay does not know.
    half = replay(steps[: len(steps) // 2])
    assert set(half.assignment) <= set(state.assignment)


def check_mode(graph: Graph, devices: list[DeviceConfig], mode: str) -> Plan | None:
    """Partition; check the plan, or check that the error is justified. Returns the plan."""
    ref = Reference(graph)
    steps, plan, error = run_collecting(partition_steps(graph, devices, mode))
    canon = canonical_devices(devices)
    if error is not None:
        message = str(error)
        assert "\n" not in message
        misfits = ref.lone_misfits(devices)
        orders = [s for s in steps if s.kind == "order"]
        order = list(orders[0].nodes) if orders else [n.name for n in graph.nodes]
        if misfits:
            # placement names an op no device runs before memory names a node too big
            assert any(f"node {m} " in message for m in misfits), (message, misfits)
            assert "needs" in message or "cannot run" in message, message
        else:
            # both modes try every sequence of the devices
            assert not any(ref.feasible(order, seq) for seq in distinct_orderings(canon)), (
                f"{mode} failed but a split exists: {message}")
            assert "too few devices" in message, message
        return None
    assert not ref.lone_misfits(devices)
    check_plan(graph, devices, mode, plan, steps)
    again = partition(graph, devices, mode)
    assert groups(again) == groups(plan) and again.bottleneck_seconds == plan.bottleneck_seconds
    return plan


def op_types(graph: Graph) -> list[str]:
    return sorted({n.op_type for n in graph.nodes})


# ------------------------------------------------------------------------------------
# memory and balanced on random DAGs and on the sample models
# ------------------------------------------------------------------------------------
@settings(max_examples=50)
@given(data=st.data())
def test_random_dag_plans(data):
    graph = load_graph(data.draw(dag_models(5, 40)))
    devices = data.draw(device_lists(total_bytes(graph), ops=op_types(graph),
                                     floor=biggest_node(graph)))
    for mode in ("memory", "balanced"):
        check_mode(graph, devices, mode)


@settings(max_examples=40)
@given(name=st.sampled_from(SAMPLE_NAMES), data=st.data())
def test_sample_model_plans(name, data):
    graph = sample_graph(name)
    devices = data.draw(device_lists(total_bytes(graph), ops=op_types(graph),
                                     floor=biggest_node(graph)))
    for mode in ("memory", "balanced"):
        check_mode(graph, devices, mode)


@pytest.mark.parametrize("seed", range(12))
def test_seeded_random_dag_plans(seed):
    """A fixed set of cases, so every run covers tight memory and restricted ops."""
    rng = Rand(seed)
    graph = load_graph(random_dag_model(rng, 5 + 3 * seed))
    devices = random_devices(rng, total_bytes(graph), ops=op_types(graph),
                             floor=biggest_node(graph))
    outcomes = [check_mode(graph, devices, mode) for mode in ("memory", "balanced")]
    assert (outcomes[0] is None) == (outcomes[1] is None), "both modes agree on feasibility"


@pytest.mark.parametrize("name", SAMPLE_NAMES)
@pytest.mark.parametrize("spec", ["cpu:1", "cpu:3", "cpu:2,sim:3", "sim:8"])
def test_sample_models_on_roomy_devices(name, spec):
    graph = sample_graph(name)
    for mode in ("memory", "balanced"):
        plan = check_mode(graph, parse_devices(spec), mode)
        assert plan is not None
        if mode == "memory":  # everything fits on the first device: one partition
            assert len(plan.partitions) == 1


@settings(max_examples=40)
@given(data=st.data())
def test_device_order_does_not_change_the_plan(data):
    if data.draw(st.booleans()):
        graph = load_graph(data.draw(dag_models(5, 30)))
    else:
        graph = sample_graph(data.draw(st.sampled_from(SAMPLE_NAMES)))
    devices = data.draw(device_lists(total_bytes(graph), min_devices=2, ops=op_types(graph),
                                     floor=biggest_node(graph)))
    shuffled = Rand(data.draw).shuffled(devices)
    for mode in ("memory", "balanced"):
        try:
            plan = partition(graph, devices, mode)
        except PartitionError as exc:
            with pytest.raises(PartitionError) as again:
                partition(graph, shuffled, mode)
            assert str(again.value) == str(exc)
            continue
        other = partition(graph, shuffled, mode)
        caps = {d.name: capability(d) for d in devices}
        assert [(p.nodes, caps[p.device]) for p in plan.partitions] == \
               [(p.nodes, caps[p.device]) for p in other.partitions]
        assert plan.bottleneck_seconds == other.bottleneck_seconds
        assert plan.order == other.order


def test_renaming_identical_devices_only_renames():
    graph = sample_graph("transformer")
    a = partition(graph, parse_devices("cpu:3"), "balanced")
    renamed = [DeviceConfig(name=n) for n in ("zeta", "alpha", "mid")]
    b = partition(graph, renamed, "balanced")
    assert [p.nodes for p in a.partitions] == [p.nodes for p in b.partitions]
    assert a.bottleneck_seconds == b.bottleneck_seconds


def test_tight_memory_forces_several_partitions():
    graph = sample_graph("mlp")
    ref = Reference(graph)
    biggest = max(ref.memory([n.name]) for n in graph.nodes)
    devices = [DeviceConfig(name=f"d{i}", memory_bytes=int(biggest * 1.2)) for i in range(7)]
    for mode in ("memory", "balanced"):
        plan = check_mode(graph, devices, mode)
        assert plan is not None and len(plan.partitions) >= 3
    with pytest.raises(PartitionError, match="too few devices"):
        partition(graph, devices[:2], "memory")


def test_restricted_ops_route_nodes_to_capable_devices():
    graph = sample_graph("mlp")
    devices = [DeviceConfig(name="fast", backend="sim", supported_ops=frozenset({"Gemm"})),
               DeviceConfig(name="cpu0")]
    for mode in ("memory", "balanced"):
        plan = check_mode(graph, devices, mode)
        assert plan is not None
        for p in plan.partitions:
            if p.device == "fast":
                assert {graph.node(n).op_type for n in p.nodes} == {"Gemm"}
    with pytest.raises(PartitionError, match="cannot run on any device"):
        partition(graph, devices[:1], "balanced")


# ------------------------------------------------------------------------------------
# user mode
# ------------------------------------------------------------------------------------
def check_user(graph: Graph, devices: list[DeviceConfig], user_map) -> Plan:
    steps, plan, error = run_collecting(partition_steps(graph, devices, "user",
                                                        user_map=user_map))
    if error is not None:
        raise error
    check_plan(graph, devices, "user", plan, steps)
    return plan


def _mlp_map() -> tuple[Graph, list[DeviceConfig], dict]:
    graph = sample_graph("mlp")
    names = [n.name for n in graph.nodes]
    mapping = {"default": "front", "partitions": {"front": "cpu0", "back": "cpu1"},
               "nodes": dict.fromkeys(names[4:], "back")}
    return graph, parse_devices("cpu:2"), mapping


def test_user_map_from_a_dict():
    graph, devices, mapping = _mlp_map()
    names = [n.name for n in graph.nodes]
    plan = check_user(graph, devices, mapping)
    assert [(p.name, p.device, p.nodes) for p in plan.partitions] == [
        ("front", "cpu0", tuple(names[:4])), ("back", "cpu1", tuple(names[4:]))]
    assert plan.mode == "user"
    assert [t.tensor for t in plan.transfers] == [graph.node(names[3]).outputs[0]]


def test_user_map_from_toml_and_json_files(tmp_path):
    graph, devices, mapping = _mlp_map()
    names = [n.name for n in graph.nodes]
    toml = tmp_path / "map.toml"
    lines = ['default = "front"', "", "[partitions]", 'front = "cpu0"', "",
             "[partitions.back]", 'device = "cpu1"', "", "[nodes]"]
    lines += [f'"{n}" = "back"' for n in names[4:]]
    toml.write_text("\n".join(lines) + "\n")
    as_json = tmp_path / "map.json"
    as_json.write_text(json.dumps(mapping))
    expected = groups(check_user(graph, devices, mapping))
    for source in (toml, str(toml), as_json):
        plan = check_user(graph, devices, source)
        assert groups(plan) == expected


def test_a_flat_user_map_names_nodes_as_its_nodes_table_does(tmp_path):
    """`node = "partition"` outside any table, as `--annotate` takes names; a key holding
    anything but a partition's name is refused by name, not read as leaving nodes out."""
    graph, devices, mapping = _mlp_map()
    flat = {"partitions": mapping["partitions"], **dict.fromkeys(
        [n.name for n in graph.nodes], "front"), **mapping["nodes"]}
    as_json = tmp_path / "flat.json"
    as_json.write_text(json.dumps(flat))
    assert groups(check_user(graph, devices, as_json)) == groups(check_user(graph, devices,
                                                                            mapping))
    with pytest.raises(PartitionError, match=r"unknown key\(s\) \['partiton'\]"):
        partition(graph, devices, "user", user_map={**mapping, "partiton": {"x": "cpu0"}})


def test_user_map_default_only_and_device_names_as_partitions():
    graph = sample_graph("cnn")
    devices = parse_devices("cpu:2")
    plan = check_user(graph, devices, {"default": "cpu1"})
    assert [(p.name, p.device, len(p.nodes)) for p in plan.partitions] == [
        ("cpu1", "cpu1", len(graph.nodes))]
    assert plan.transfers == []


def test_user_map_with_a_cycle_between_partitions():
    graph, devices, _ = _mlp_map()
    names = [n.name for n in graph.nodes]
    # mlp is a chain: node 0 and 2.. on p0, node 1 on p1 -> p0 -> p1 -> p0.
    cyclic = {"default": "p0", "partitions": {"p0": "cpu0", "p1": "cpu1"},
              "nodes": {names[1]: "p1"}}
    with pytest.raises(PartitionError, match="cycle") as info:
        partition(graph, devices, "user", user_map=cyclic)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("mapping, needle", [
    ({"default": "p0", "partitions": {"p0": "gpu7"}}, "gpu7"),
    ({"default": "cpu0", "nodes": {"no/such/node": "cpu0"}}, "no/such/node"),
    ({"nodes": {"fc1": "cpu0"}}, "unmapped"),
])
def test_user_map_errors(mapping, needle):
    graph, devices, _ = _mlp_map()
    with pytest.raises(PartitionError) as info:
        partition(graph, devices, "user", user_map=mapping)
    assert needle in str(info.value)


def test_user_mode_needs_a_map_and_a_readable_file(tmp_path):
    graph, devices, _ = _mlp_map()
    with pytest.raises(PartitionError, match="needs a map"):
        partition(graph, devices, "user")
    with pytest.raises(PartitionError, match="not found"):
        partition(graph, devices, "user", user_map=tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("default = \n")
    with pytest.raises(PartitionError, match="cannot read"):
        partition(graph, devices, "user", user_map=bad)


def test_user_map_over_memory_is_rejected():
    graph, _, mapping = _mlp_map()
    tiny = [DeviceConfig(name="cpu0", memory_bytes=10_000), DeviceConfig(name="cpu1")]
    with pytest.raises(PartitionError, match="cpu0 needs"):
        partition(graph, tiny, "user", user_map=mapping)


@settings(max_examples=40)
@given(data=st.data())
def test_random_user_maps(data):
    """A plan exactly when the partition graph is acyclic; then groups follow the map."""
    graph = load_graph(data.draw(dag_models(5, 25)))
    r = Rand(data.draw)
    k = r.int(1, 3)
    devices = [DeviceConfig(name=f"cpu{i}") for i in range(r.int(1, 3))]
    parts = {f"q{j}": r.choice(devices).name for j in range(k)}
    names = [n.name for n in graph.nodes]
    nodes = {n: f"q{r.int(0, k - 1)}" for n in names if r.chance(0.5)}
    mapping = {"default": "q0", "partitions": parts, "nodes": nodes}
    home = {n: nodes.get(n, "q0") for n in names}
    quotient = nx.DiGraph()
    quotient.add_nodes_from(set(home.values()))
    quotient.add_edges_from((home[a], home[b]) for a, b in graph.dag.edges if home[a] != home[b])
    if not nx.is_directed_acyclic_graph(quotient):
        with pytest.raises(PartitionError, match="cycle"):
            partition(graph, devices, "user", user_map=mapping)
        return
    plan = check_user(graph, devices, mapping)
    expected = {}
    for n, part in home.items():
        expected.setdefault(part, set()).add(n)
    assert groups(plan) == {(frozenset(m), parts[p]) for p, m in expected.items()}
    assert {p.name for p in plan.partitions} == set(expected)


def test_modes_constant():
    assert set(MODES) == {"memory", "balanced", "user"}


def test_user_map_onto_a_device_that_cannot_run_a_node():
    graph, _, _ = _mlp_map()
    devices = [DeviceConfig(name="relu_only", backend="sim", supported_ops=frozenset({"Relu"})),
               DeviceConfig(name="cpu0")]
    mapping = {"default": "cpu0", "nodes": {graph.nodes[0].name: "relu_only"}}
    with pytest.raises(PartitionError, match="relu_only cannot run"):
        partition(graph, devices, "user", user_map=mapping)


# ------------------------------------------------------------------------------------
# Degenerate graphs
# ------------------------------------------------------------------------------------
def _passthrough_graph() -> Graph:
    """A legal model with no nodes: its output is its input."""
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([], "passthrough", [value], [value]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return load_graph(model)


@pytest.mark.parametrize("mode", ["memory", "balanced"])
def test_graph_without_nodes_gives_an_empty_plan(mode):
    """balanced returns an empty plan; memory mode should too, not crash (ValueError from
    max() of no stages in greedy.rebalance)."""
    graph = _passthrough_graph()
    assert graph.nodes == []
    plan = partition(graph, parse_devices("cpu:2"), mode)
    assert plan.partitions == [] and plan.bottleneck_seconds == 0.0


@pytest.mark.parametrize("mode", ["memory", "balanced"])
def test_single_node_graph_on_many_devices(mode):
    graph = load_graph(random_dag_model(3, 1))
    devices = parse_devices("cpu:3,sim:5")
    plan = check_mode(graph, devices, mode)
    assert plan is not None and len(plan.partitions) == 1


@pytest.mark.parametrize("seed", range(200, 260))
def test_region_splits_fit_their_devices_as_the_plan_counts_memory(seed):
    """Region splits check room as the plan will count it: a tensor a device keeps from
    one of its stretches to a later one holds memory while it waits (counted apart, such
    a split was rejected whole at validation, or worse, kept no plan at all)."""
    r = Rand(seed)
    graph = load_graph(random_dag_model(r, r.int(6, 24)))
    devices = random_devices(r, total_bytes(graph), max_devices=4,
                             ops=sorted({n.op_type for n in graph.nodes}),
                             floor=biggest_node(graph))
    try:
        allowed = place(graph, devices, read_annotations(None)).allowed
    except PartitionError:
        return
    costs = CostModel.roofline(graph)
    seg = Segments(graph, costs, placement_order(graph, allowed), allowed)
    for style in STYLES:
        try:
            split = finish(region_split(seg, canonical_devices(devices), style, Recorder()))
        except PartitionError:
            continue
        groups = [(f"p{i}", d.name, seg.order[a:b]) for i, (a, b, d) in enumerate(split)]
        held = build_plan(graph, costs, devices, groups, mode="balanced",
                          order=seg.order).device_memory()
        assert all(held[d.name] <= d.memory_bytes for d in devices), (style, held)


@pytest.mark.parametrize("blocks", [60, 240])
def test_filling_searches_for_each_end_rather_than_stepping(blocks, monkeypatch):
    """A fit is a walk of the stretch's liveness wherever the bytes it touches exceed the
    device: stepping one node at a time made filling quadratic (457 s at 10,000 nodes).
    Filling asks about as many fits per device as the order has bits."""
    graph = load_graph(matmul_chain(16, blocks, seed=blocks))
    devices = [DeviceConfig(name=f"cpu{i}", memory_bytes=int(total_bytes(graph) * 0.6))
               for i in range(3)]
    walks = []
    memory = Segments.memory
    monkeypatch.setattr(Segments, "memory", lambda seg, a, b: walks.append(b - a) or
                        memory(seg, a, b))
    seg = Segments(graph, CostModel.roofline(graph), [n.name for n in graph.nodes])
    split = finish(fill(seg, devices, Recorder()))
    assert split[-1][1] == seg.n and walks, "the stretches touch more than a device holds"
    assert len(walks) <= 3 * len(devices) * seg.n.bit_length(), len(walks)
    for a, b, device in split:  # each stretch fits and ends where the next node would not
        assert seg.fits(a, b, device) and (b == seg.n or not seg.fits(a, b + 1, device))


@settings(max_examples=40)
@given(data=st.data())
def test_stretch_memory_counts_as_liveness_does_on_every_stretch(data):
    """`Segments.memory` reads arrays indexed once; it must give what `liveness` counts by
    walking the stretch, for every stretch of any topological order."""
    graph = load_graph(data.draw(dag_models(3, 24)))
    rng = Rand(data.draw(st.integers(0, 2**32 - 1)))
    rank = {n.name: rng.int(0, 1000) for n in graph.nodes}
    order = list(nx.lexicographical_topological_sort(graph.dag, key=rank.__getitem__))
    nodes = [graph.node(n) for n in order]
    stretch = StretchMemory(graph, nodes)
    for a in range(len(nodes)):
        for b in range(a, len(nodes) + 1):
            walked = weight_bytes(graph, nodes[a:b]) + peak_activation_bytes(graph, nodes[a:b])
            assert stretch(a, b) == walked, (a, b)


@settings(max_examples=20)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_weight_made_before_a_stretch_is_one_of_its_weights(seed):
    """A tensor made from weights alone before a stretch is a weight of it (the stretch
    makes it as it loads), counted once and whole, as `liveness` counts walking it."""
    graph = load_graph(made_weights(5))
    assert len(graph.constant_nodes) == 5  # the fold keeps the fills
    rng = Rand(seed)
    rank = {n.name: rng.int(0, 1000) for n in graph.nodes}
    order = list(nx.lexicographical_topological_sort(graph.dag, key=rank.__getitem__))
    nodes = [graph.node(n) for n in order]
    stretch = StretchMemory(graph, nodes)
    for a in range(len(nodes)):
        before = {m.name for m in nodes[:a]}
        for b in range(a + 1, len(nodes) + 1):
            inside = nodes[a:b]
            held = {t for n in inside for t in n.reads
                    if graph.is_weight(t) or (graph.is_constant(t) and graph.producer[t] in before)}
            weights = weight_bytes(graph, inside)
            assert weights == sum(map(graph.tensor_bytes, held)), (a, b)
            assert stretch.split(a, b)[0] == weights, (a, b)
            assert stretch(a, b) == weights + peak_activation_bytes(graph, inside), (a, b)


@settings(max_examples=60)
@given(data=st.data())
def test_a_devices_stretches_bound_its_memory_from_both_sides(data):
    """Region splits settle most fits from each stretch alone: the device's peak is at
    least the largest stretch's own and at most their peaks and inputs summed."""
    graph = load_graph(data.draw(dag_models(3, 30)))
    nodes, rng = list(graph.nodes), Rand(data.draw(st.integers(0, 2**32 - 1)))
    cuts = sorted({rng.int(0, len(nodes)) for _ in range(rng.int(2, 8))} | {0, len(nodes)})
    stretches = [(a, b) for a, b in itertools.pairwise(cuts) if rng.int(0, 2) and b > a]
    if not stretches:
        return
    parts = [_Part(str(i), "d", tuple(n.name for n in nodes[a:b]))
             for i, (a, b) in enumerate(stretches)]
    peak = device_peak_bytes(parts, graph, "d")
    alone = [StretchMemory(graph, nodes).split(a, b) for a, b in stretches]
    assert max(p for _, p, _ in alone) <= peak <= sum(p + i for _, p, i in alone)


def test_boundary_moves_jump_to_where_two_stages_balance():
    """Filling leaves the first of two devices nearly everything; the moves that follow
    bring the cut to the best one the second device has room for, in a few steps rather
    than one per node."""
    graph = load_graph(matmul_chain(16, 120, seed=3))
    seg = Segments(graph, CostModel.roofline(graph), [n.name for n in graph.nodes])
    room = int(seg.memory(0, int(seg.n * 0.9)))
    devices = [DeviceConfig(name=f"cpu{i}", memory_bytes=room) for i in range(2)]
    split = finish(fill(seg, devices, Recorder()))
    assert len(split) == 2 and split[0][1] > seg.n * 0.8
    steps: list = []
    (a, c, d0), (_, b, d1) = finish(tap(rebalance(seg, split, Recorder()), steps.append))
    best = min(max(seg.seconds(0, k, d0), seg.seconds(k, b, d1))
               for k in range(1, b) if seg.fits(k, b, d1) and seg.fits(0, k, d0))
    assert max(seg.seconds(a, c, d0), seg.seconds(c, b, d1)) <= best * (1 + 1e-9)
    moved = sum(len(s.nodes) for s in steps)
    assert moved >= seg.n * 0.3 and len(steps) <= 2 * seg.n.bit_length(), (moved, len(steps))
