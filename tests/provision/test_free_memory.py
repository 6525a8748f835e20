"""Two networks on one host: the second is planned into the memory the first left free,
and its plan names the devices its partitions run on (cpu devices here; ray devices in
tests/devices/test_ray.py)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.devices import DeviceConfig
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.partition import partition
from runtime.partition.plan import Plan
from tests.real_models.test_real_models import expected, model_path, saved_inputs

RTOL, ATOL = 1e-4, 1e-5


def need(name: str) -> int:
    """Bytes the network takes on one device, as its plan counts them."""
    graph = load_graph(model_path(name))
    plan = partition(graph, [DeviceConfig(name="one", memory_bytes=1 << 30)], "balanced")
    return plan.device_memory()["one"]


def planned_where_loaded(events: list, network: str) -> None:
    """The plan as the partitioner made it (`partition.planned`) put each partition
    where the provisioner loaded it (`provision.loaded`): nothing moved to a twin."""
    planned = next(e for e in events if e.kind == "partition.planned"
                   and e.get("network") == network)
    loaded = {e.get("partition"): e.get("device") for e in events
              if e.kind == "provision.loaded" and e.get("network") == network}
    assert {p["name"]: p["device"] for p in planned.get("partitions")} == loaded


def runs_where_it_says(host: HostManager, network: str, plan: Plan) -> None:
    """Every partition of the plan is loaded on the device the plan names, and nowhere
    else; and host.plan is that plan."""
    assert host.plan(network) == plan
    for p in plan.partitions:
        holders = [d for d in host.devices.values() if f"{network}/{p.name}" in d.keys]
        assert [d.name for d in holders] == [p.device], p.name


def answers(host: HostManager, network: str) -> None:
    feeds = saved_inputs(network)
    got = host.infer(network, feeds)
    for name, want in expected(network, feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("first,second", [("bert", "gpt2"), ("gpt2", "bert")])
def test_the_second_network_plans_into_the_free_memory(first, second):
    """The first network fills most of cpu0; the second fits only where there is room,
    and its plan says so (planned against whole devices, it was split onto cpu0 and
    quietly loaded elsewhere)."""
    memory = max(need(first), need(second)) + need(second) // 10
    devices = [DeviceConfig(name=f"cpu{i}", memory_bytes=memory) for i in range(2)]
    with HostManager(devices) as host:
        host.add_network(first, model_path(first), devices=["cpu0"])
        free = {d.name: d.free_bytes for d in host.devices.values()}
        assert free["cpu0"] < need(second)
        events = host.bus.subscribe(kinds=("partition.planned", "provision.loaded"))
        plan = host.add_network(second, model_path(second))
        planned_where_loaded(events.drain(), second)
        runs_where_it_says(host, second, plan)
        for device, used in plan.device_memory().items():
            assert used <= free[device], (device, used, free[device])
        for network in (first, second):
            answers(host, network)


def test_a_plan_split_over_two_partly_filled_devices_fits_both():
    """Both devices have some room left: the plan uses each within what it has."""
    memory = need("gpt2") * 3 // 4 + need("bert") // 2
    devices = [DeviceConfig(name=f"cpu{i}", memory_bytes=memory) for i in range(2)]
    with HostManager(devices) as host:
        host.add_network("bert", model_path("bert"))  # balanced over both
        free = {d.name: d.free_bytes for d in host.devices.values()}
        events = host.bus.subscribe(kinds=("partition.planned", "provision.loaded"))
        plan = host.add_network("gpt2", model_path("gpt2"))
        planned_where_loaded(events.drain(), "gpt2")
        runs_where_it_says(host, "gpt2", plan)
        for device, used in plan.device_memory().items():
            assert used <= free[device]
        answers(host, "gpt2")
