"""The provisioner (runtime/provision/): a network's programs loaded onto devices, once per
replica, into a frozen LoadedNetwork, or nothing left loaded at all. A partition whose
device is full goes to a twin of it, the one with the most room; one that fits nowhere
fails in one line naming the partition, the device, the bytes it needs and those free,
with every device as it was. Twins are devices alike in every compared field but the name.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections.abc import Mapping

import numpy as np
import pytest

from runtime.devices import Device, DeviceConfig, open_device, parse_devices
from runtime.errors import DeviceMemoryError, PrismError
from runtime.executor.executor import Executor
from runtime.executor.requests import Request
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.inputs import signature
from runtime.observe.events import EventBus
from runtime.partition import partition
from runtime.partition.replicas import twin_maps
from runtime.provision.from_model import Programs, load_network
from runtime.provision.network import LoadedNetwork, place_replicas, unload_network
from runtime.provision.provisioner import provision, twins, unload
from runtime.units import human_bytes
from tests.partition.test_memory_plan import middle_graph
from tests.support.fakes import relu_program
from tests.support.hosts import replicas_by_device, sims, used
from tests.support.serving import CNN, MLP, TRANSFORMER, WAIT, assert_same, expected, mlp_feeds


@pytest.fixture
def opened():
    """Devices opened from configs on one bus (`opened(configs)` -> (devices, bus)), each
    closed afterwards."""
    made: list[Device] = []

    def open_all(configs: list[DeviceConfig]) -> tuple[dict[str, Device], EventBus]:
        bus = EventBus()
        devices = {c.name: open_device(c, bus) for c in configs}
        made.extend(devices.values())
        return devices, bus

    yield open_all
    for device in made:
        device.close()


def answer(executor: Executor, feeds: dict) -> dict:
    """One request run through a replica's executor, waited for."""
    box: cf.Future = cf.Future()
    executor.start(Request(executor.network, feeds), lambda request, outputs, error: (
        box.set_exception(error) if error is not None else box.set_result(outputs)))
    return box.result(timeout=WAIT)


def holdings(devices: Mapping[str, Device]) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Device name -> (bytes it holds, the keys loaded on it)."""
    return {name: (d.used_bytes, d.keys) for name, d in devices.items()}


# -- loading, rollback and replicas, directly ------------------------------------------------


def test_a_failed_provision_leaves_every_device_as_it_was_and_says_what_did_not_fit(opened):
    """Devices of different figures (no twins to fall back on); the device of a later
    partition is filled so that partition no longer fits: every partition loaded before it
    is unloaded again, and the error is one line naming the partition, the device, the
    bytes needed and the bytes free."""
    rng = np.random.default_rng()
    configs = [DeviceConfig(name=f"sim{i}", backend="sim", memory_bytes=(64 << 20) + i)
               for i in range(3)]  # one byte apart: no two are twins
    graph = load_graph(TRANSFORMER)
    plan = partition(graph, configs, "balanced")
    made = Programs(graph, plan)
    # the first partition on the device of the last: nothing of this plan is on it yet
    victim = next(p for p in plan.partitions if p.device == plan.partitions[-1].device)
    before_it = plan.partitions[:plan.partitions.index(victim)]
    assert before_it, "some partition must be loaded before the one that fails"
    devices, bus = opened(configs)
    device = devices[victim.device]
    need = made[victim.name].weight_bytes + made[victim.name].activation_bytes
    free = int(rng.integers(0, need))  # a byte short, or many more
    device.load("filler", relu_program(weight_bytes=device.config.memory_bytes - free))
    before = holdings(devices)
    sub = bus.subscribe(maxlen=10_000, kinds=("provision.",))
    with pytest.raises(DeviceMemoryError) as info:
        provision(plan, made, devices, network="m", bus=bus)
    assert str(info.value) == (  # the device's own account: its weights and whole arena
        f"m/{victim.name} needs {human_bytes(need)} on {victim.device}, "
        f"{human_bytes(free)} free of {human_bytes(device.config.memory_bytes)}")
    assert holdings(devices) == before
    events = sub.drain()
    loaded = [(e["partition"], e["device"]) for e in events if e.kind == "provision.loaded"]
    evicted = [(e["partition"], e["device"]) for e in events if e.kind == "provision.evicted"]
    assert loaded == [(p.name, p.device) for p in before_it]
    assert evicted == loaded[::-1]  # rolled back, last loaded first
    device.unload("filler")  # with room, the same plan loads whole, and unloads whole
    placed = provision(plan, made, devices, network="m", bus=bus)
    assert [(lp.partition.name, lp.key, lp.device.name) for lp in placed] == [
        (p.name, f"m/{p.name}", p.device) for p in plan.partitions]
    unload(placed, network="m", bus=bus)
    assert all(d.used_bytes == 0 and d.keys == () for d in devices.values())


def test_what_a_partition_needs_counts_its_devices_whole_arena(opened):
    """A partition's program brings its device's arena (the peak of the device's memory
    plan, which a partition of few live tensors may be below): a device too small for
    the arena refuses it, and the error's figures say so (what it needs exceeds what is
    free), not the partition's own smaller activations."""
    graph, where = middle_graph()
    configs = [DeviceConfig(name="cpu0"), DeviceConfig(name="cpu1")]
    plan = partition(graph, configs, "balanced", annotations={"nodes": where})
    first = plan.partitions[0]
    arena = plan.arenas[first.device]
    assert first.memory_bytes < arena, "the case: a partition below its device's peak"
    small = DeviceConfig(name=first.device, memory_bytes=(first.memory_bytes + arena) // 2)
    devices, bus = opened([small, configs[1]])
    with pytest.raises(DeviceMemoryError) as info:
        provision(plan, Programs(graph, plan), devices, network="middle", bus=bus)
    assert str(info.value) == (
        f"middle/{first.name} needs {human_bytes(first.weight_bytes + arena)} on "
        f"{first.device}, {human_bytes(small.memory_bytes)} free of "
        f"{human_bytes(small.memory_bytes)}")
    assert all(d.used_bytes == 0 for d in devices.values())


def test_a_loaded_network_is_frozen(opened):
    """What the host serves cannot change under it: assigning or deleting any field of a
    LoadedNetwork raises and leaves the field as it was; the network still answers."""
    devices, bus = opened(parse_devices("cpu:2"))
    net = load_network("m", MLP, devices, bus)
    assert isinstance(net, LoadedNetwork)
    for field in dataclasses.fields(LoadedNetwork):
        value = getattr(net, field.name)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(net, field.name, None)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(net, field.name)
        assert getattr(net, field.name) is value, field.name
    feeds = mlp_feeds(np.random.default_rng(), 2)
    [replica] = net.replicas
    assert_same(answer(replica, feeds), expected(MLP, feeds))
    unload_network(net, bus)
    assert all(d.used_bytes == 0 for d in devices.values())


def test_two_replicas_on_twin_devices_load_each_partition_twice_under_distinct_keys(opened):
    """place_replicas with the plan's own devices and one twin map: each partition is
    loaded on its device as `m/p` and on that device's twin as `m#1/p`, the twins hold
    what the plan's devices hold, and each replica's executor answers on its own devices."""
    rng = np.random.default_rng()
    configs = parse_devices("cpu:4")  # all twins
    graph = load_graph(TRANSFORMER)
    plan = partition(graph, configs[:2], "balanced")
    own = {p.device for p in plan.partitions}
    assert len(plan.partitions) >= 2 and own <= {"cpu0", "cpu1"}
    [twin] = twin_maps(plan, configs, 1)
    assert set(twin) == own and not own & set(twin.values())
    devices, bus = opened(configs)
    sub = bus.subscribe(maxlen=10_000, kinds=("provision.loaded",))
    loaded, executors = place_replicas("m", plan, Programs(graph, plan), devices, bus,
                                       [None, twin], signature(graph), graph)
    assert len(loaded) == len(executors) == 2
    want = [[(p.name, f"m/{p.name}", p.device) for p in plan.partitions],
            [(p.name, f"m#1/{p.name}", twin[p.device]) for p in plan.partitions]]
    assert [[(lp.partition.name, lp.key, lp.device.name) for lp in replica]
            for replica in loaded] == want
    keys = [key for replica in want for _, key, _ in replica]
    assert len(set(keys)) == 2 * len(plan.partitions)
    for name, device in devices.items():
        assert sorted(device.keys) == sorted(key for replica in want
                                             for _, key, on in replica if on == name), name
    for d in own:
        assert devices[d].used_bytes > 0 and devices[d].used_bytes == devices[twin[d]].used_bytes
    assert sorted((e["partition"], e["device"]) for e in sub.drain()) == sorted(
        (p, on) for replica in want for p, _, on in replica)
    for executor, replica in zip(executors, want, strict=True):
        runs = {on: devices[on].stats().runs for _, _, on in replica}
        feeds = {"tokens": rng.standard_normal((2, 16, 64)).astype(np.float32)}
        assert_same(answer(executor, feeds), expected(TRANSFORMER, feeds))
        assert all(devices[on].stats().runs > runs[on] for on in runs), "ran elsewhere"
    for replica in loaded:
        unload(replica, network="m", bus=bus)
    assert all(d.used_bytes == 0 and d.keys == () for d in devices.values())


# -- through the host ------------------------------------------------------------------------


def test_a_replica_that_cannot_fit_leaves_nothing_loaded():
    config = sims(1)[0]
    graph = load_graph(CNN)
    need = sum(p.memory_bytes for p in partition(graph, [config], "balanced").partitions)
    memory = int(need * 1.5)  # one replica fits a device, two do not
    with HostManager(sims(2, memory_bytes=memory)) as host:
        host.devices["sim1"].load("filler", relu_program(weight_bytes=memory - need // 2))
        before = used(host)
        sub = host.bus.subscribe(maxlen=10_000, kinds=("provision.",))
        with pytest.raises(PrismError) as info:
            host.add_network("c", CNN, replicas=2)
        message = str(info.value)
        assert "\n" not in message, message
        assert "c/" in message and "needs" in message and "sim1" in message, message
        assert used(host) == before
        assert host.devices["sim0"].keys == () and host.devices["sim1"].keys == ("filler",)
        assert host.networks() == []
        events = sub.drain()
        assert len([e for e in events if e.kind == "provision.loaded"]) == len(
            [e for e in events if e.kind == "provision.evicted"])
        host.devices["sim1"].unload("filler")
        host.add_network("c", CNN, replicas=2)  # the name is free; with room it loads
        assert host.replicas("c") == 2
        assert replicas_by_device(host, "c") == {"": {"sim0"}, "#1": {"sim1"}}


def test_a_partition_whose_device_is_full_goes_to_a_twin_with_the_most_room():
    """The plan names sim0; sim0 is full, so the partition goes to a twin (the one with
    more room), never to a device of other figures, however roomy."""
    graph = load_graph(MLP)
    need = sum(p.memory_bytes for p in partition(graph, sims(1), "memory").partitions)
    memory = int(need * 1.5)
    devices = [*sims(3, memory_bytes=memory), DeviceConfig(name="big", backend="sim",
                                                           memory_bytes=memory * 10)]
    with HostManager(devices) as host:
        host.devices["sim0"].load("filler", relu_program(weight_bytes=memory - need // 2))
        host.devices["sim1"].load("filler", relu_program(weight_bytes=need // 4))
        plan = host.add_network("m", MLP, partition={"default": "sim0"})
        assert replicas_by_device(host, "m") == {"": {"sim2"}}
        assert [p.device for p in plan.partitions] == ["sim2"]  # where it runs
        assert host.plan("m").device("sim2").memory_bytes == memory
        rng = np.random.default_rng()
        f = mlp_feeds(rng, 2)
        assert_same(host.run("m", f).result(timeout=WAIT), expected(MLP, f))


# -- twins -----------------------------------------------------------------------------------


def test_twins_are_devices_alike_in_every_compared_field_but_the_name():
    """`figures()` is the key devices are grouped by; a field it left out would make twins
    of devices that differ. The fields are read from DeviceConfig itself."""
    base = DeviceConfig(name="a", backend="sim")
    assert twins(base, base.with_name("b")) and base.figures() == base.with_name("b").figures()
    changed = {"backend": "cpu", "memory_bytes": base.memory_bytes + 1, "threads": 2,
               "supported_ops": frozenset({"Add"}), "precisions": frozenset({"float"}),
               "spin": False}
    ray_only = {"timing": "sim", "node": "10.0.0.5", "resources": {"GPU": 1}}  # ray's own
    compared = [f.name for f in dataclasses.fields(DeviceConfig) if f.compare and f.name != "name"]
    for name in compared:
        one = DeviceConfig(name="a", backend="ray") if name in ray_only else base
        given = {**changed, **ray_only}
        value = given[name] if name in given else getattr(one, name) * 2
        other = dataclasses.replace(one, name="b", **{name: value})
        assert not twins(one, other), name
    assert twins(base, dataclasses.replace(base, name="b", extra={"note": 1}))  # not compared
