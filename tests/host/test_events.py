"""What the host publishes: one request's events in order and complete, and each request's
under load; a failure naming its partition and device; adding and removing a network;
every event with its catalogue's fields, as JSON; and a slow subscriber delays no request."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections import defaultdict

import numpy as np

from runtime.devices import parse_devices
from runtime.errors import ExecutionError
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds
from runtime.observe.events import EVENT_KINDS, Event
from runtime.partition import partition_steps
from tests.support.hosts import faked
from tests.support.serving import MLP, TRANSFORMER, WAIT, Events, idle, poll


def test_one_request_event_stream_is_ordered_and_complete():
    with HostManager(parse_devices("cpu:3")) as host:
        plan = host.add_network("t", TRANSFORMER, partition="balanced")
        parts = {p.name: p for p in plan.partitions}
        assert len(parts) == 3
        events = Events(host)
        feeds = {"tokens": np.random.default_rng().standard_normal((2, 16, 64))
                 .astype(np.float32)}
        host.run("t", feeds).result(timeout=WAIT)
        assert poll(lambda: events.of("request.finished"))
        rid = events.of("request.queued")[0]["request"]
        mine = [e for e in events.all() if e.get("request") == rid]
        kinds = [e.kind for e in mine]
        assert kinds[:2] == ["request.queued", "request.started"]
        assert kinds[-1] == "request.finished"
        middle = mine[2:-1]
        assert [e.kind for e in middle] == ["partition.run.started", "partition.run.finished"] * 3
        ts = [e.ts for e in mine]
        assert ts == sorted(ts)
        pos = {}
        for i, e in enumerate(middle):
            assert e["network"] == "t"
            assert e["device"] == parts[e["partition"]].device
            pos.setdefault(e["partition"], []).append(i)
        assert set(pos) == set(parts)
        producer = {t: p.name for p in plan.partitions for t in p.outputs}
        for name, (started, ended) in pos.items():
            assert ended == started + 1
            for t in parts[name].inputs:
                if t in producer:
                    assert pos[producer[t]][1] < started
        for e in middle[1::2]:
            assert e["run_seconds"] >= 0 and e["queue_wait"] >= 0
        fin = mine[-1]
        assert fin["latency"] >= fin["run_seconds"] >= 0 and fin["network"] == "t"


def test_event_order_per_request_under_load():
    with HostManager(parse_devices("cpu:3"), max_queue=1000) as host:
        host.add_network("t", TRANSFORMER, partition="balanced")
        events = Events(host, kinds=("request.", "partition.run."))
        specs = input_specs(host.graph("t"))

        def client(_):
            rng = np.random.default_rng()
            futs = [host.run("t", random_feeds(specs, rng)) for _ in range(40)]
            return [f.result(timeout=WAIT) for f in futs]

        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(client, range(8)))
        assert poll(lambda: len(events.of("request.finished")) == 320)
        per: dict[int, list[str]] = defaultdict(list)
        for e in events.all():
            per[e["request"]].append(e.kind)
        assert len(per) == 320
        for rid, kinds in per.items():
            assert kinds[0] == "request.queued", (rid, kinds)
            assert kinds[1] == "request.started", (rid, kinds)
            assert kinds[-1] == "request.finished", (rid, kinds)


def test_a_requests_end_is_on_the_bus_before_its_caller_has_the_answer():
    """A client that reads the bus (or the server's statistics) once it has its answer
    finds that request counted: when each caller is answered (its future's done-callback
    runs), as many requests have ended on the bus as callers have been answered, alone,
    in a batch and failed."""
    with faked("cpu:2", max_queue=1000) as host:
        host.add_network("t", TRANSFORMER, partition="balanced")
        host.add_network("b", MLP, batching={"max_batch_size": 8, "max_queue_delay_ms": 20})
        seen = host.bus.subscribe(kinds=("request.finished", "request.failed"))
        lock, ends, answers, behind = threading.Lock(), [0], [0], []

        def answered(_: cf.Future) -> None:
            with lock:
                ends[0] += len(seen.drain())
                answers[0] += 1
                if ends[0] < answers[0]:
                    behind.append(answers[0])

        rng = np.random.default_rng()
        calls = [("t", random_feeds(input_specs(host.graph("t")), rng)) for _ in range(20)]
        calls += [("b", random_feeds(input_specs(host.graph("b")), rng)) for _ in range(24)]
        futures = [host.run(name, feeds) for name, feeds in calls]
        host.devices[host.plan("t").partitions[-1].device].fail = lambda n, _: True
        futures.append(failing := host.run("t", calls[0][1]))
        for future in futures:
            future.add_done_callback(answered)
        cf.wait(futures, timeout=WAIT)
        assert all(f.done() for f in futures) and failing.exception() is not None
        assert poll(lambda: answers[0] == len(futures))  # callbacks run after waiters wake
    assert not behind


def test_failed_request_event_names_partition_and_device():
    """DESIGN.md: the first error is reported with the partition and device it came from;
    the request.failed event carries `partition` and `device` fields."""
    with faked("cpu:3") as host:
        plan = host.add_network("t", TRANSFORMER, partition="balanced")
        middle = plan.partitions[1]
        host.devices[middle.device].fail = lambda n, _: True
        events = Events(host, kinds=("request.failed",))
        feeds = {"tokens": np.zeros((1, 16, 64), np.float32)}
        assert isinstance(host.run("t", feeds).exception(timeout=WAIT), ExecutionError)
        assert poll(lambda: events.of("request.failed"))
        [failed] = events.of("request.failed")
        assert failed["partition"] == middle.name
        assert failed["device"] == middle.device


def test_add_and_remove_publish_their_events():
    devices = parse_devices("cpu:3")
    with HostManager(devices) as host:
        events = Events(host)
        plan = host.add_network("t", TRANSFORMER, partition="balanced")
        steps = list(partition_steps(host.graph("t"), devices, "balanced"))
        kinds = ("partition.step", "partition.planned", "provision.loaded", "network.loaded")
        seen = [e for e in events.all() if e.kind in kinds]
        step_events = [e for e in seen if e.kind == "partition.step"]
        assert len(step_events) == len(steps)
        assert [e["index"] for e in step_events] == list(range(len(steps)))
        assert [e["step"] for e in step_events] == [s.kind for s in steps]
        assert step_events[-1]["step"] == "planned"
        n = len(steps)
        assert seen[n].kind == "partition.planned"
        assert seen[n]["bottleneck_seconds"] == plan.bottleneck_seconds
        loaded = seen[n + 1:-1]
        assert [e.kind for e in loaded] == ["provision.loaded"] * len(plan.partitions)
        assert [(e["partition"], e["device"]) for e in loaded] == [
            (p.name, p.device) for p in plan.partitions]
        assert seen[-1].kind == "network.loaded" and seen[-1]["partitions"] == 3
        events.seen.clear()
        host.remove_network("t")
        evicted = events.of("provision.evicted")
        assert sorted((e["partition"], e["device"], e["bytes"]) for e in evicted) == sorted(
            (p.name, p.device, p.weight_bytes + p.activation_bytes) for p in plan.partitions)
        memory = events.of("device.memory")
        assert memory and all(m.used_bytes == 0 for m in host.devices.values())


def test_every_event_has_its_catalogue_fields_and_serialises_to_json():
    """DESIGN.md: events carry JSON-serialisable fields and serialise to JSON lines."""
    with faked("cpu:2") as host:
        events = Events(host)
        plan = host.add_network("m", MLP, partition="balanced")
        host.devices[plan.partitions[-1].device].fail = lambda n, _: n == 2
        for _ in range(3):
            host.run("m", {"x": np.ones((1, 256), np.float32)}).exception(timeout=WAIT)
        assert poll(lambda: len(events.of("request.finished")) + len(
            events.of("request.failed")) == 3)
        host.remove_network("m")
        seen = events.all()
        assert {e.kind for e in seen} >= {
            "network.loaded", "partition.step", "partition.planned", "provision.loaded",
            "provision.evicted", "device.memory", "request.queued", "request.started",
            "partition.run.started", "partition.run.finished", "request.finished",
            "request.failed"}
        bad = []
        for e in seen:
            missing = set(EVENT_KINDS.get(e.kind, ())) - set(e.fields)
            assert not missing, (e.kind, missing)
            try:
                back = Event.from_json(e.to_json())
            except (TypeError, ValueError) as exc:
                bad.append(f"{e.kind}: {exc}")
                continue
            assert back.kind == e.kind and back.ts == e.ts
            assert set(back.fields) == set(e.fields)
        assert not bad, sorted(set(bad))


# -- subscribers -----------------------------------------------------------------------------


def _burst(host: HostManager, feeds: list[dict]) -> float:
    start = time.perf_counter()
    futures = [host.run("m", f) for f in feeds]
    for fut in futures:
        fut.result(timeout=WAIT)
    return time.perf_counter() - start


def test_slow_subscriber_never_delays_requests():
    with HostManager(parse_devices("cpu:2"), max_queue=1000) as host:
        host.add_network("m", MLP, partition="balanced")
        rng = np.random.default_rng()
        feeds = [{"x": rng.standard_normal((2, 256)).astype(np.float32)} for _ in range(300)]
        _burst(host, feeds[:50])  # warm up
        baseline = min(_burst(host, feeds) for _ in range(2))
        slow = host.bus.subscribe(maxlen=10)  # never drained while requests run
        with_slow = _burst(host, feeds)
        assert with_slow < 2 * baseline + 0.05, (with_slow, baseline)
        assert poll(lambda: idle(host))
        lost = slow.lost
        assert lost > 300
        drained = slow.drain()
        assert drained[0].kind == "bus.lost" and drained[0]["lost"] == lost
        assert len(drained) <= 11
        assert slow.drain() == []  # lost is reported once
        slow.close()
