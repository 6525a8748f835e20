"""`balanced` finds the least bottleneck over every split of its order, by brute force.

A split cuts plan.order into contiguous segments, each on a device of its own, the
devices in any sequence; it counts when every segment fits and runs on its device.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import PartitionError
from runtime.graph import Graph, load_graph
from runtime.partition import balanced, canonical_devices, partition, partition_steps
from tests.support.dags import (
    SAMPLE_NAMES,
    Rand,
    Reference,
    biggest_node,
    close,
    collect,
    device_lists,
    matmul_chain,
    order_of,
    random_dag_model,
    random_devices,
    sample_graph,
    total_bytes,
)


def check_optimal(graph: Graph, devices: list[DeviceConfig], *, brute: bool = True) -> str:
    """Compare balanced (and memory) with the exhaustive minimum. Returns an outcome tag."""
    ref = Reference(graph)
    canon = canonical_devices(devices)
    try:
        steps, plan = collect(partition_steps(graph, devices, "balanced"))
    except PartitionError as exc:
        order = order_of(graph, devices, "balanced")
        best = ref.any_sequence(order, canon, brute=brute)
        assert best is None, f"balanced failed but a split fits: {exc}"
        with pytest.raises(PartitionError):
            partition(graph, devices, "memory")
        return "infeasible"
    assert steps[-1].kind == "planned"
    order = list(plan.order)
    best = ref.any_sequence(order, canon, brute=brute)
    names = [d.name for d in canon]
    idx = [names.index(p.device) for p in plan.partitions]
    if len(idx) != len(set(idx)):
        # Placement interleaves devices and a split with repeated devices won: it must
        # beat every split that gives each device one segment.
        assert best is None or plan.bottleneck_seconds <= best * (1 + 1e-9)
        return "planned"
    assert best is not None, "balanced made a plan where no split fits"
    assert close(plan.bottleneck_seconds, best), (plan.bottleneck_seconds, best)
    # The plan's own split is one of those counted: check its bottleneck directly too.
    bounds, devs, at = [0], [], 0
    for p in plan.partitions:
        at += len(p.nodes)
        bounds.append(at)
        devs.append(canon[names.index(p.device)])
    assert close(ref.split_bottleneck(order, bounds, devs), best)
    memory = partition(graph, devices, "memory")
    assert plan.bottleneck_seconds <= memory.bottleneck_seconds * (1 + 1e-9), (
        f"balanced {plan.bottleneck_seconds} > memory {memory.bottleneck_seconds}"
        f" (same order: {memory.order == plan.order})")
    return "planned"


def test_brute_force_and_plain_dp_agree():
    """The two references agree, so the DP one can stand in on the larger sample models."""
    for seed in range(15):
        r = Rand(seed)
        graph = load_graph(random_dag_model(r, r.int(3, 10)))
        devices = canonical_devices(random_devices(r, total_bytes(graph), max_devices=4,
                                                   floor=biggest_node(graph)))
        ref = Reference(graph)
        order = [n.name for n in graph.nodes]
        a, b = ref.brute_force(order, devices), ref.exact_dp(order, devices)
        assert (a is None) == (b is None) and (a is None or close(a, b))
        assert (a is not None) == ref.feasible(order, devices)


@pytest.mark.parametrize("seed", range(40))
def test_balanced_is_optimal_on_seeded_small_dags(seed):
    r = Rand(1000 + seed)
    graph = load_graph(random_dag_model(r, r.int(2, 12)))
    ops = sorted({n.op_type for n in graph.nodes})
    devices = random_devices(r, total_bytes(graph), max_devices=4, ops=ops,
                             floor=biggest_node(graph))
    check_optimal(graph, devices)


@settings(max_examples=60)
@given(data=st.data())
def test_balanced_is_optimal_on_random_small_dags(data):
    graph = load_graph(random_dag_model(data.draw, data.draw(st.integers(1, 12))))
    ops = sorted({n.op_type for n in graph.nodes})
    devices = data.draw(device_lists(total_bytes(graph), max_devices=4, ops=ops,
                                     floor=biggest_node(graph)))
    check_optimal(graph, devices)


def test_heterogeneous_tight_devices_use_several_partitions():
    """Hand-picked: slow big device, fast small ones; the optimum mixes them."""
    graph = load_graph(random_dag_model(5, 12, max_width=64))
    floor = biggest_node(graph)
    devices = [DeviceConfig(name="big", memory_bytes=10 * floor),
               DeviceConfig(name="fast0", backend="sim", memory_bytes=int(1.5 * floor),
                            peak_flops=5e12, link_bandwidth=1e9),
               DeviceConfig(name="fast1", backend="sim", memory_bytes=int(1.5 * floor),
                            peak_flops=5e12, link_bandwidth=1e9),
               DeviceConfig(name="slowlink", backend="sim", memory_bytes=3 * floor,
                            link_bandwidth=1e8)]
    assert check_optimal(graph, devices) == "planned"


@pytest.mark.parametrize("name", SAMPLE_NAMES)
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_balanced_is_optimal_on_sample_models(name, count):
    graph = sample_graph(name)
    devices = parse_devices(f"cpu:{count}")
    small = len(graph.nodes) <= 12 or count <= 2
    assert check_optimal(graph, devices, brute=small) == "planned"
    plan = partition(graph, devices, "balanced")
    if count > 1 and len(graph.nodes) > 10:
        assert len(plan.partitions) > 1, "identical roomy devices: spreading out pays"


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_balanced_is_optimal_on_sample_models_with_mixed_devices(name):
    graph = sample_graph(name)
    floor = biggest_node(graph)
    devices = [DeviceConfig(name="cpu0", threads=2),
               DeviceConfig(name="sim0", backend="sim", memory_bytes=2 * floor),
               DeviceConfig(name="sim1", backend="sim", memory_bytes=4 * floor,
                            link_bandwidth=1e9)]
    assert check_optimal(graph, devices, brute=False) == "planned"


@pytest.mark.parametrize("seed", range(3))
def test_balanced_puts_the_body_on_accelerators_between_cpu_ends(seed):
    """The devices' canonical sequence lists the roomy cpus first, yet only a sequence
    cpu -> accelerators -> cpu uses the accelerators: balanced finds it."""
    graph = load_graph(matmul_chain(256, 6, seed))
    floor = biggest_node(graph)
    devices = [DeviceConfig(name=f"cpu{i}", memory_bytes=100 * floor) for i in range(2)] + [
        DeviceConfig(name=f"npu{i}", backend="sim", memory_bytes=3 * floor, peak_flops=5e13,
                     mem_bandwidth=1e12, supported_ops=frozenset({"MatMul", "Relu"}))
        for i in range(4)]
    assert check_optimal(graph, devices, brute=False) == "planned"
    plan = partition(graph, devices, "balanced")
    on = [p.device for p in plan.partitions]
    assert on[0].startswith("cpu") and on[-1].startswith("cpu"), on
    assert any(d.startswith("npu") for d in on), on
    canon = canonical_devices(devices)
    in_sequence = Reference(graph).exact_dp(list(plan.order), canon)
    assert in_sequence is None or plan.bottleneck_seconds < in_sequence, (
        "the canonical sequence alone would have done as well")


@pytest.mark.parametrize("seed", range(12))
def test_too_many_states_keep_the_canonical_sequence(seed, monkeypatch):
    """Past its state budget, balanced splits over the devices in canonical sequence,
    each one optional, and is exactly as good as the best such split."""
    monkeypatch.setattr(balanced, "MAX_WORK", 0)
    r = Rand(2000 + seed)
    graph = load_graph(random_dag_model(r, r.int(2, 12)))
    devices = random_devices(r, total_bytes(graph), max_devices=4,
                             ops=sorted({n.op_type for n in graph.nodes}),
                             floor=biggest_node(graph))
    canon, ref = canonical_devices(devices), Reference(graph)
    try:
        plan = partition(graph, devices, "balanced")
    except PartitionError:
        assert ref.brute_force(order_of(graph, devices, "balanced"), canon) is None
        return
    best = ref.brute_force(list(plan.order), canon)
    assert best is not None and plan.bottleneck_seconds <= best * (1 + 1e-9)
    on = [p.device for p in plan.partitions]
    if len(on) == len(set(on)):  # one segment per device: a split in canonical sequence
        names = [d.name for d in canon]
        assert [names.index(d) for d in on] == sorted(names.index(d) for d in on)
        assert close(plan.bottleneck_seconds, best)


def test_memory_fits_where_filling_the_canonical_sequence_does_not():
    """The roomier accelerators come first in canonical sequence but cannot run the stem:
    filling skips them for good and runs out of cpus. A split in another sequence fits,
    and memory mode takes it rather than fail."""
    width, blocks = 64, 7
    graph = load_graph(matmul_chain(width, blocks, seed=1))
    block = width * width * 4
    devices = [DeviceConfig(name=f"cpu{i}", memory_bytes=int(2.5 * block)) for i in range(2)] + [
        DeviceConfig(name=f"npu{i}", backend="sim", memory_bytes=int(3.5 * block),
                     supported_ops=frozenset({"MatMul", "Relu"})) for i in range(2)]
    plan = partition(graph, devices, "memory")
    on = [p.device for p in plan.partitions]
    assert on[0].startswith("cpu") and on[-1].startswith("cpu") and len(set(on)) == len(on)
    assert len(on) == Reference(graph).fewest(list(plan.order), devices), on


@pytest.mark.parametrize("seed", [*range(24), 175, 231, 298])
def test_memory_makes_the_fewest_partitions_in_any_sequence(seed):
    """Filling the roomiest device first can take more devices than another sequence
    (seed 175: cpu0 then cpu4 leave two stretches over; cpu4 then cpu0 hold it all)."""
    rng = Rand(seed)
    graph = load_graph(random_dag_model(rng, 6 + seed % 20))
    devices = random_devices(rng, total_bytes(graph), floor=biggest_node(graph), max_devices=5)
    try:
        plan = partition(graph, devices, "memory")
    except PartitionError:
        assert Reference(graph).fewest(order_of(graph, devices, "memory"), devices) is None
        return
    on = [p.device for p in plan.partitions]
    if len(set(on)) == len(on):  # one stretch per device: a split of the order
        assert len(on) == Reference(graph).fewest(list(plan.order), devices), on
    if seed == 175:  # the stepper says why the roomiest device is not filled first
        steps, _ = collect(partition_steps(graph, devices, "memory"))
        opens = [s.reason for s in steps if s.kind == "open"]
        assert "2 devices in this sequence (cpu4, cpu0) hold it" in opens[0], opens
