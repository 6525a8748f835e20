"""Replication (Glow's saturateHost): whole replicas of a plan on twin devices, least-busy
routing, and the memory account when replicas come and go."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections import Counter

import numpy as np
import pytest

from runtime.devices import parse_devices
from runtime.errors import PrismError
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.partition import partition
from runtime.partition.replicas import twin_maps
from runtime.provision.provisioner import twins
from tests.support.fakes import FakeDevice, Gate
from tests.support.hosts import replicas_by_device, sims, used
from tests.support.serving import CNN, MLP, WAIT, Events, assert_same, expected


def image(rng, batch: int = 1) -> dict:
    return {"image": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}


def vector(rng, batch: int = 1) -> dict:
    return {"x": rng.standard_normal((batch, 256)).astype(np.float32)}


# -- all replicas serve -----------------------------------------------------------------------


def test_four_replicas_on_four_sims_all_serve_and_share_the_load():
    # a few ms a run, so 40 concurrent requests really overlap
    with HostManager(sims(4, peak_flops=2e10, mem_bandwidth=2e8), max_queue=200) as host:
        plan = host.add_network("c", CNN, replicas=4)
        assert host.replicas("c") == 4
        assert {p.device for p in plan.partitions} == {"sim0"}
        placed = replicas_by_device(host, "c")
        assert sorted(placed) == ["", "#1", "#2", "#3"]
        assert set().union(*placed.values()) == set(host.devices)
        assert all(len(d) == 1 for d in placed.values())
        rng = np.random.default_rng()
        for _ in range(4):  # one at a time: each replica once (least recently used), warm
            host.run("c", image(rng)).result(timeout=WAIT)
        sub = host.bus.subscribe(maxlen=100_000, kinds=("partition.run.finished",))
        barrier = threading.Barrier(40)
        feeds = [image(rng) for _ in range(40)]

        def client(f: dict) -> dict:
            barrier.wait(WAIT)
            return host.run("c", f).result(timeout=WAIT)

        with cf.ThreadPoolExecutor(40) as pool:
            results = list(pool.map(client, feeds))
        for f, got in zip(feeds, results, strict=True):
            assert_same(got, expected(CNN, f))
        runs = Counter(e["device"] for e in sub.drain())
        assert set(runs) == set(host.devices), runs
        assert sum(runs.values()) == 40
        assert all(7 <= n <= 13 for n in runs.values()), f"uneven: {runs}"
        assert all(m.stats().runs > 0 for m in host.devices.values())


def test_least_busy_routing_then_least_recently_used():
    with HostManager(parse_devices("cpu:2"), device_factory=FakeDevice) as host:
        host.add_network("m", MLP, replicas=2)
        assert host.replicas("m") == 2
        assert replicas_by_device(host, "m") == {"": {"cpu0"}, "#1": {"cpu1"}}
        sub = host.bus.subscribe(maxlen=10_000, kinds=("partition.run.finished",))
        rng = np.random.default_rng()
        for _ in range(6):  # one at a time: every choice is a tie, so they alternate
            f = vector(rng)
            assert_same(host.run("m", f).result(timeout=WAIT), expected(MLP, f))
        assert [e["device"] for e in sub.drain()] == ["cpu0", "cpu1"] * 3
        # hold the next request (it goes to cpu0, least recently used) at a gate
        gate = host.devices["cpu0"].gate = Gate()
        box: list = []
        held = vector(rng)
        thread = threading.Thread(target=lambda: box.append(host.run("m", held)), daemon=True)
        thread.start()
        assert gate.entered.wait(5)
        for _ in range(5):  # cpu0's replica has one outstanding, cpu1's none: all go to cpu1
            f = vector(rng)
            assert_same(host.run("m", f).result(timeout=WAIT), expected(MLP, f))
        gate.opened.set()
        thread.join(WAIT)
        assert_same(box[0].result(timeout=WAIT), expected(MLP, held))
        assert [e["device"] for e in sub.drain()] == ["cpu1"] * 5 + ["cpu0"]


def test_replicas_with_batching_serve_on_every_replica():
    with HostManager(parse_devices("cpu:2"), max_queue=500) as host:
        host.add_network("m", MLP, replicas=2,
                         batching={"max_batch_size": 8, "max_queue_delay_ms": 2})
        assert host.replicas("m") == 2
        sub = host.bus.subscribe(maxlen=100_000, kinds=("partition.run.finished",
                                                        "request.started"))
        rng = np.random.default_rng()
        feeds = [vector(rng, int(rng.integers(1, 3))) for _ in range(200)]
        with cf.ThreadPoolExecutor(16) as pool:
            futures = list(pool.map(lambda f: host.run("m", f), feeds))
        for f, fut in zip(feeds, futures, strict=True):
            assert_same(fut.result(timeout=WAIT), expected(MLP, f))
        events = sub.drain()
        runs = Counter(e["device"] for e in events if e.kind == "partition.run.finished")
        assert set(runs) == {"cpu0", "cpu1"}, runs
        assert any(e["batch_size"] > 1 for e in events if e.kind == "request.started")
        host.remove_network("m")
        assert all(b == 0 for b in used(host).values())


def test_batches_of_one_network_run_at_once_on_its_replicas():
    """Batching with replicas: while one replica runs a batch, the batcher sends the next
    to the other, so batches overlap in time on the two devices (sim devices hold each
    run for its modelled time). A batcher that runs each batch on its own thread makes
    them take turns, and no two runs ever overlap."""
    with HostManager(sims(2, peak_flops=2e7), max_queue=500, max_active=16) as host:
        host.add_network("m", MLP, replicas=2, partition="memory",
                         batching={"max_batch_size": 4, "max_queue_delay_ms": 1})
        assert host.replicas("m") == 2
        events = Events(host, kinds=("partition.run.started", "partition.run.finished"))
        rng = np.random.default_rng()
        feeds = [vector(rng) for _ in range(64)]
        with cf.ThreadPoolExecutor(16) as pool:
            futures = list(pool.map(lambda f: host.run("m", f), feeds))
        for f, fut in zip(feeds, futures, strict=True):
            assert_same(fut.result(timeout=WAIT), expected(MLP, f))
        spans: dict[str, list[tuple[float, float]]] = {}
        began = {}
        for e in events.all():
            key = (e["device"], e["request"])
            if e.kind == "partition.run.started":
                began[key] = e.ts
            else:
                spans.setdefault(e["device"], []).append((began.pop(key), e.ts))
        assert set(spans) == {"sim0", "sim1"}, spans
        overlapping = [(a, b) for a in spans["sim0"] for b in spans["sim1"]
                       if a[0] < b[1] and b[0] < a[1]]
        assert overlapping, "the replicas took turns: no two batches ran at once"


# -- where replicas go ------------------------------------------------------------------------


def test_saturate_on_a_mixed_host_places_replicas_on_twins_only():
    """The plan takes the fewest devices it fits on (one cpu; cpus come first in the
    canonical order) and is replicated onto every remaining twin group: the other cpu. The
    sims are no twins of a cpu, so they stay empty."""
    with HostManager(parse_devices("cpu:2,sim:2")) as host:
        plan = host.add_network("c", CNN, replicas="saturate")
        assert {p.device for p in plan.partitions} == {"cpu0"}
        assert host.replicas("c") == 2
        placed = replicas_by_device(host, "c")
        assert placed == {"": {"cpu0"}, "#1": {"cpu1"}}
        configs = {n: m.config for n, m in host.devices.items()}
        assert twins(configs["cpu0"], configs["cpu1"])
        assert used(host)["sim0"] == used(host)["sim1"] == 0
        rng = np.random.default_rng()
        for _ in range(4):
            f = image(rng, 2)
            assert_same(host.run("c", f).result(timeout=WAIT), expected(CNN, f))


def test_saturate_on_four_sims():
    with HostManager(sims(4)) as host:
        host.add_network("c", CNN, replicas="saturate")
        assert host.replicas("c") == 4
        assert sorted(map(sorted, replicas_by_device(host, "c").values())) == [
            ["sim0"], ["sim1"], ["sim2"], ["sim3"]]


def test_saturate_replicates_a_two_device_plan_onto_twin_pairs():
    with HostManager(sims(4, memory_bytes=600_000)) as host:  # cnn needs two of these
        plan = host.add_network("c", CNN, replicas="saturate")
        assert len({p.device for p in plan.partitions}) == 2
        assert host.replicas("c") == 2
        placed = replicas_by_device(host, "c")
        assert len(placed) == 2 and all(len(d) == 2 for d in placed.values())
        assert placed[""].isdisjoint(placed["#1"])
        rng = np.random.default_rng()
        sub = host.bus.subscribe(maxlen=10_000, kinds=("partition.run.finished",))
        for _ in range(8):
            f = image(rng)
            assert_same(host.run("c", f).result(timeout=WAIT), expected(CNN, f))
        assert {e["device"] for e in sub.drain()} == set(host.devices)


def test_replicas_n_plans_over_one_nth_of_the_devices():
    """Documented: with replicas=N the plan is made over the first 1/N of the devices (in
    canonical order, rounded down) and replicated N-1 times onto twins. cpu:3, N=2: the plan
    is on one cpu, one replica goes to a second, the third stays free."""
    with HostManager(parse_devices("cpu:3")) as host:
        plan = host.add_network("m", MLP, replicas=2)
        assert {p.device for p in plan.partitions} == {"cpu0"}
        assert host.replicas("m") == 2
        assert replicas_by_device(host, "m") == {"": {"cpu0"}, "#1": {"cpu1"}}
        assert used(host)["cpu2"] == 0
        rng = np.random.default_rng()
        sub = host.bus.subscribe(maxlen=10_000, kinds=("partition.run.finished",))
        for _ in range(4):
            f = vector(rng)
            assert_same(host.run("m", f).result(timeout=WAIT), expected(MLP, f))
        assert Counter(e["device"] for e in sub.drain()) == {"cpu0": 2, "cpu1": 2}


def test_two_replicas_on_a_mixed_host_with_room_for_two():
    """cpu:2,sim:2 has room for two twin replicas of cnn (one per cpu, or one per cpu+sim
    pair), so replicas=2 should load two. plan_devices takes the first half of the
    canonical order, i.e. both cpus, and then finds no twins for them."""
    with HostManager(parse_devices("cpu:2,sim:2")) as host:
        host.add_network("c", CNN, replicas=2)
        assert host.replicas("c") == 2
        placed = replicas_by_device(host, "c")
        assert placed[""].isdisjoint(placed["#1"])
        configs = {n: m.config for n, m in host.devices.items()}
        assert sorted(configs[d].backend for d in placed[""]) == \
            sorted(configs[d].backend for d in placed["#1"])


def modelled_rate(plan, devices) -> float:
    """Requests a second the cost model gives `plan` placed as often as twins allow."""
    return (1 + len(twin_maps(plan, devices, None))) / plan.bottleneck_seconds


def test_auto_replicates_a_network_that_fits_over_equal_devices():
    """Two equal cpus: two whole replicas model more requests a second than the pipeline
    over both (the same work plus a copy, on uneven stages), so auto replicates, and both
    replicas serve, with the right answers."""
    devices = parse_devices("cpu:2")
    graph = load_graph(CNN)
    pipeline = partition(graph, devices, "balanced")
    whole = partition(graph, devices[:1], "balanced")
    assert len({p.device for p in pipeline.partitions}) == 2
    assert modelled_rate(whole, devices) > modelled_rate(pipeline, devices)
    with HostManager(devices) as host:
        plan = host.add_network("c", CNN, replicas="auto")
        assert len({p.device for p in plan.partitions}) == 1 and host.replicas("c") == 2
        assert sorted(map(sorted, replicas_by_device(host, "c").values())) == [
            ["cpu0"], ["cpu1"]]
        sub = host.bus.subscribe(maxlen=10_000, kinds=("partition.run.finished",))
        rng = np.random.default_rng()
        feeds = [image(rng, 2) for _ in range(16)]
        futures = [host.run("c", f) for f in feeds]
        for f, future in zip(feeds, futures, strict=True):
            assert_same(future.result(timeout=WAIT), expected(CNN, f))
        assert {e["device"] for e in sub.drain()} == {"cpu0", "cpu1"}


def test_auto_keeps_a_pipeline_where_it_models_faster():
    """A cpu and a sim are no twins: one device alone serves one replica, and the pipeline
    over both has the lower bottleneck, so auto keeps the pipeline ("saturate" would use
    one device and leave the other idle)."""
    devices = parse_devices("cpu:1,sim:1")
    graph = load_graph(CNN)
    alone = [partition(graph, [d], "balanced").bottleneck_seconds for d in devices]
    both = partition(graph, devices, "balanced")
    assert both.bottleneck_seconds < min(alone)
    with HostManager(devices) as host:
        plan = host.add_network("c", CNN, replicas="auto")
        assert {p.device for p in plan.partitions} == {"cpu0", "sim0"}
        assert host.replicas("c") == 1
        assert plan.bottleneck_seconds == both.bottleneck_seconds
        rng = np.random.default_rng()
        f = image(rng)
        assert_same(host.run("c", f).result(timeout=WAIT), expected(CNN, f))


def test_auto_weighs_replicas_against_a_pipeline_where_memory_binds():
    """cnn needs two of these sims: auto plans each device count that fits and keeps the
    one whose replicas the cost model rates fastest, whichever that is."""
    devices = sims(4, memory_bytes=600_000)
    graph = load_graph(CNN)
    rates = {}
    for k in range(2, 5):  # one sim is too small
        plan = partition(graph, devices[:k], "balanced")
        rates[k] = (modelled_rate(plan, devices), len({p.device for p in plan.partitions}))
    with pytest.raises(PrismError, match="fit"):
        partition(graph, devices[:1], "balanced")
    best = max(rates.values())
    with HostManager(devices) as host:
        plan = host.add_network("c", CNN, replicas="auto")
        assert len({p.device for p in plan.partitions}) == best[1]
        assert modelled_rate(plan, devices) == pytest.approx(best[0])
        assert host.replicas("c") == 1 + len(twin_maps(plan, devices, None))


# -- removing frees every replica -------------------------------------------------------------


def test_remove_network_frees_every_byte_of_every_replica():
    with HostManager(sims(4, peak_flops=2e11)) as host:
        before = used(host)
        assert all(b == 0 for b in before.values())
        sub = host.bus.subscribe(maxlen=10_000, kinds=("provision.",))
        host.add_network("c", CNN, replicas=4)
        assert all(b > 0 for b in used(host).values())
        rng = np.random.default_rng()
        futures = [host.run("c", image(rng)) for _ in range(12)]
        for f in futures:
            f.result(timeout=WAIT)
        host.remove_network("c")
        assert used(host) == before
        assert all(m.keys == () for m in host.devices.values())
        events = sub.drain()
        loaded = Counter(e["device"] for e in events if e.kind == "provision.loaded")
        evicted = Counter(e["device"] for e in events if e.kind == "provision.evicted")
        assert loaded == evicted == {d: 1 for d in host.devices}
        host.add_network("c", CNN, replicas=4)  # and it all fits again
        assert host.replicas("c") == 4


# -- refusals ---------------------------------------------------------------------------------


def test_more_replicas_than_devices_is_refused():
    with HostManager(sims(4)) as host:
        with pytest.raises(PrismError) as info:
            host.add_network("c", CNN, replicas=5)
        message = str(info.value)
        assert "\n" not in message and "5" in message and "4" in message, message
        assert host.networks() == []
        assert all(b == 0 for b in used(host).values())


@pytest.mark.parametrize("replicas", [0, -1, 2.5, "lots", ""])  # None: the default
def test_bad_replicas_value_is_refused(replicas):
    with HostManager(sims(2)) as host:
        with pytest.raises(PrismError) as info:
            host.add_network("c", CNN, replicas=replicas)
        assert "\n" not in str(info.value)
        assert "replicas" in str(info.value)
        assert host.networks() == []
        assert all(b == 0 for b in used(host).values())
