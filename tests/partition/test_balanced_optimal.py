"""`balanced` finds the least bottleneck over every split of its order, by brute force.

A split cuts plan.order into contiguous, possibly empty segments, the j-th on the j-th
of canonical_devices(devices); it counts when every segment fits and runs on its device.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import PartitionError
from runtime.graph import Graph, load_graph
from runtime.partition import canonical_devices, partition, partition_steps
from tests.support.dags import (
    SAMPLE_NAMES,
    Rand,
    Reference,
    biggest_node,
    close,
    collect,
    device_lists,
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
        best = ref.brute_force(order, canon) if brute else ref.exact_dp(order, canon)
        assert best is None, f"balanced failed but a split fits: {exc}"
        with pytest.raises(PartitionError):
            partition(graph, devices, "memory")
        return "infeasible"
    assert steps[-1].kind == "planned"
    order = list(plan.order)
    best = ref.brute_force(order, canon) if brute else ref.exact_dp(order, canon)
    names = [d.name for d in canon]
    idx = [names.index(p.device) for p in plan.partitions]
    if idx != sorted(set(idx)):
        # Placement interleaves devices and a split with repeated devices won: it must
        # beat every contiguous split.
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
