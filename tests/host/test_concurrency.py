"""Many requests at once, with faults among them: each request resolves once with its own
outputs, a fault fails exactly the requests it hit (naming partition and device) and the
host goes on serving, and a burst from one thread pipelines over the devices."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections import Counter

import numpy as np
import pytest

from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import ExecutionError
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds
from tests.support.fakes import FakeDevice, FaultySim, inject_marked
from tests.support.hosts import faked
from tests.support.serving import (
    MLP,
    TRANSFORMER,
    WAIT,
    Events,
    assert_same,
    check_storm,
    expected,
    idle,
    mlp_feeds,
    poll,
    storm,
)

# -- many requests at once -------------------------------------------------------------------


def test_500_requests_from_16_threads_each_resolve_once_with_own_outputs():
    with HostManager(parse_devices("cpu:3"), max_queue=1000) as host:
        plan = host.add_network("t", TRANSFORMER, partition="balanced")
        assert len(plan.partitions) == 3
        events = Events(host, kinds=("request.",))
        specs = input_specs(host.graph("t"))
        lock = threading.Lock()
        calls: Counter = Counter()
        submitted: list[tuple[dict, cf.Future]] = []
        barrier = threading.Barrier(16)

        def counter(key):
            def done(_):
                with lock:
                    calls[key] += 1
            return done

        def client(count: int) -> None:
            rng = np.random.default_rng()
            barrier.wait(timeout=10)
            for _ in range(count):
                feeds = random_feeds(specs, rng, {"batch": 2})
                fut = host.run("t", feeds)
                fut.add_done_callback(counter(id(fut)))
                with lock:
                    submitted.append((feeds, fut))

        threads = [threading.Thread(target=client, args=(32 if i < 4 else 31,))
                   for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert len(submitted) == 500
        for feeds, fut in submitted:
            assert_same(fut.result(timeout=WAIT), expected(TRANSFORMER, feeds))
        assert poll(lambda: len(calls) == 500)
        time.sleep(0.05)
        assert set(calls.values()) == {1}
        assert poll(lambda: len(events.of("request.finished")) >= 500)
        finished = Counter(e["request"] for e in events.of("request.finished"))
        queued = {e["request"] for e in events.of("request.queued")}
        assert len(finished) == 500 and set(finished.values()) == {1}
        assert set(finished) == queued
        assert events.of("request.failed") == []
        assert poll(lambda: idle(host))


def test_single_submitter_gets_pipelining():
    """DESIGN.md: many requests are in flight at once, so stages overlap. A client that
    sends a burst of requests from one thread (run() returns futures) must see the stages
    of consecutive requests overlap on different devices, not run one after another."""
    devices = [DeviceConfig(name=f"sim{i}", backend="sim", peak_flops=5e7) for i in range(2)]
    with HostManager(devices, max_queue=1000) as host:
        plan = host.add_network("m", MLP, partition="balanced")
        assert len(plan.partitions) == 2
        stages = [p.stage_seconds for p in plan.partitions]
        n = 20
        serial = n * sum(stages)  # every request's stages one after another
        pipelined = n * max(stages) + min(stages)
        assert pipelined < 0.85 * serial  # the model is split well enough to tell apart
        feeds = {"x": np.ones((1, 256), np.float32)}
        host.run("m", feeds).result(timeout=WAIT)
        start = time.perf_counter()
        futures = [host.run("m", feeds) for _ in range(n)]
        for f in futures:
            f.result(timeout=WAIT)
        wall = time.perf_counter() - start
        assert wall < (serial + pipelined) / 2, (wall, serial, pipelined)


# -- fault injection -------------------------------------------------------------------------


def test_fault_on_data_fails_exactly_those_requests():
    with faked("cpu:3", max_queue=1000) as host:
        plan = host.add_network("t", TRANSFORMER, partition="balanced")
        first = plan.partitions[0]
        assert "tokens" in first.inputs
        host.devices[first.device].fail = lambda n, feeds: feeds["tokens"].flat[0] > 0
        rng = np.random.default_rng()
        feeds = [{"tokens": rng.standard_normal((2, 16, 64)).astype(np.float32)}
                 for _ in range(40)]
        feeds[0]["tokens"].flat[0] = abs(feeds[0]["tokens"].flat[0]) + 0.1
        feeds[1]["tokens"].flat[0] = -abs(feeds[1]["tokens"].flat[0]) - 0.1
        futures = [host.run("t", f) for f in feeds]
        for f, fut in zip(feeds, futures, strict=True):
            if f["tokens"].flat[0] > 0:
                err = fut.exception(timeout=WAIT)
                assert isinstance(err, ExecutionError), err
                assert f"t/{first.name}" in str(err) and first.device in str(err)
                assert "injected fault" in str(err)
            else:
                assert_same(fut.result(timeout=WAIT), expected(TRANSFORMER, f))
        # keeps serving, on good inputs and after the fault is gone
        good = {"tokens": -np.abs(rng.standard_normal((2, 16, 64))).astype(np.float32)}
        assert_same(host.run("t", good).result(timeout=WAIT), expected(TRANSFORMER, good))
        host.devices[first.device].fail = None
        bad_before = {"tokens": np.abs(rng.standard_normal((2, 16, 64))).astype(np.float32)}
        assert_same(host.run("t", bad_before).result(timeout=WAIT),
                    expected(TRANSFORMER, bad_before))
        assert poll(lambda: idle(host))


def test_fault_every_third_call_on_middle_partition():
    with faked("cpu:3") as host:
        plan = host.add_network("t", TRANSFORMER, partition="balanced")
        middle = plan.partitions[1]
        host.devices[middle.device].fail = lambda n, _: n % 3 == 0
        rng = np.random.default_rng()
        for i in range(1, 13):  # one at a time: request i is the middle partition's call i
            feeds = {"tokens": rng.standard_normal((2, 16, 64)).astype(np.float32)}
            fut = host.run("t", feeds)
            if i % 3 == 0:
                err = fut.exception(timeout=WAIT)
                assert isinstance(err, ExecutionError), err
                assert f"t/{middle.name}" in str(err) and middle.device in str(err)
            else:
                assert_same(fut.result(timeout=WAIT), expected(TRANSFORMER, feeds))


# -- every request ends exactly once ---------------------------------------------------------


@pytest.mark.parametrize("factory", [FakeDevice, FaultySim], ids=["fake", "sim"])
def test_2000_requests_with_faults_cancellations_and_timeouts_end_once(factory):
    """Faults of every kind (raised, interrupted inline and on a worker, an output missing,
    mistyped or misshapen, a run held past its timeout) among cancels and timeouts."""
    devices = [DeviceConfig(name=f"sim{i}", backend="sim", peak_flops=2e9) for i in range(2)]
    with HostManager(devices, max_queue=5000, device_factory=factory) as host:
        plan = host.add_network("m", MLP, partition="balanced")
        assert len(plan.partitions) == 2
        inject_marked(host.devices[plan.partitions[0].device])
        events = Events(host, kinds=("request.",))
        records = storm(host, "m", mlp_feeds, faults=0.1)
        outcomes = check_storm(host, "m", mlp_feeds, events, records, MLP)
        assert min(outcomes[k] for k in ("cancelled", "timeout", "result", "raise",
                                         "missing", "dtype", "shape")) > 0, outcomes
        assert outcomes["interrupt"] + outcomes["interrupted"] > 0, outcomes
