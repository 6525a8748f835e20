"""HostManager: the public contract, concurrency, faults, errors, priorities and events."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import threading
import time
from collections import Counter, defaultdict

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from runtime.devices import DeviceConfig, parse_devices
from runtime.errors import (
    ExecutionError,
    HostClosedError,
    InvalidInputError,
    NetworkBusyError,
    NetworkExistsError,
    NetworkNotFoundError,
    PrismError,
    QueueFullError,
    RequestTimeoutError,
)
from runtime.host import HostManager, lean
from runtime.inputs import input_specs, random_feeds
from runtime.observe.events import EVENT_KINDS, Event
from runtime.partition import partition_steps
from tests.support.fakes import FakeDevice, FaultySim, Gate, blocking, inject_marked
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

# -- helpers -------------------------------------------------------------------------------


def toy_chain(width: int = 4) -> onnx.ModelProto:
    """x -> Relu -> Neg -> y, with a symbolic batch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["h"], name="relu"),
                               helper.make_node("Neg", ["h"], ["y"], name="neg")],
                              "toy", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


TOY_MAP = {"partitions": {"p0": "cpu0", "p1": "cpu1"}, "nodes": {"relu": "p0", "neg": "p1"}}


def toy_feeds(rng=None, batch: int = 2) -> dict:
    rng = rng or np.random.default_rng()
    return {"x": rng.standard_normal((batch, 4)).astype(np.float32)}


def toy_expected(feeds: dict) -> np.ndarray:
    return -np.maximum(feeds["x"], 0)


def faked(spec: str, **kw) -> HostManager:
    """A host on fake devices with the figures of `spec`: real values, injectable faults."""
    return HostManager(parse_devices(spec), device_factory=FakeDevice, **kw)


def gated_toy(max_active: int = 1, max_queue: int = 10) -> tuple[HostManager, Gate]:
    """A 2-partition toy on cpu0 -> cpu1 whose second partition waits at a gate."""
    host = faked("cpu:2", max_active=max_active, max_queue=max_queue)
    plan = host.add_network("toy", toy_chain(), partition=TOY_MAP)
    assert [p.device for p in plan.partitions] == ["cpu0", "cpu1"]
    gate = host.devices["cpu1"].gate = Gate()
    return host, gate


class Blocked:
    """A request sent from its own thread that is held at the gate. `run` may execute an
    idle device's partitions on the calling thread, so the caller may block with it."""

    def __init__(self, host: HostManager, gate: Gate, **kw):
        self.feeds = toy_feeds()
        self.box: list = []
        self.thread = threading.Thread(
            target=lambda: self.box.append(host.run("toy", self.feeds, **kw)), daemon=True)
        self.thread.start()
        assert gate.entered.wait(5), "the first request never reached the gate"

    def future(self) -> cf.Future:
        self.thread.join(WAIT)
        assert not self.thread.is_alive() and self.box, "run() did not return"
        return self.box[0]


# -- the public contract ---------------------------------------------------------------------


def test_design_contract_verbatim():
    from runtime import DeviceConfig, HostManager  # exactly as DESIGN.md writes it

    rng = np.random.default_rng()
    devices = [DeviceConfig(name=f"cpu{i}", backend="cpu", memory_bytes=512 << 20)
               for i in range(4)]
    with HostManager(devices) as host:
        host.add_network("bert", str(TRANSFORMER), partition="balanced")
        plan = host.plan("bert")
        ids = rng.standard_normal((2, 16, 64)).astype(np.float32)
        future = host.run("bert", {"tokens": ids})
        assert isinstance(future, cf.Future)
        outputs = future.result(timeout=WAIT)
        assert_same(outputs, expected(TRANSFORMER, {"tokens": ids}))
        assert len(plan.partitions) > 1
        host.remove_network("bert")
        assert host.networks() == []


@pytest.mark.parametrize("source", ["path", "str", "proto", "bytes"])
def test_add_by_path_and_by_model_proto(source):
    model = {"path": TRANSFORMER, "str": str(TRANSFORMER), "proto": onnx.load(TRANSFORMER),
             "bytes": TRANSFORMER.read_bytes()}[source]
    devices = [DeviceConfig(name=f"cpu{i}", backend="cpu", memory_bytes=512 << 20)
               for i in range(4)]
    rng = np.random.default_rng()
    with HostManager(devices) as host:
        plan = host.add_network("bert", model, partition="balanced", annotations=None,
                                fallback=None, replicas=1, batching=None)
        assert plan is host.plan("bert")
        for _ in range(3):
            feeds = {"tokens": rng.standard_normal((2, 16, 64)).astype(np.float32)}
            assert_same(host.run("bert", feeds).result(timeout=WAIT),
                        expected(TRANSFORMER, feeds))
        assert_same(host.infer("bert", feeds), expected(TRANSFORMER, feeds))


def test_plan_fields():
    devices = [DeviceConfig(name=f"cpu{i}", backend="cpu", memory_bytes=512 << 20)
               for i in range(4)]
    for d in devices:
        for field in ("name", "backend", "memory_bytes", "threads", "peak_flops",
                      "mem_bandwidth", "link_bandwidth", "supported_ops"):
            assert hasattr(d, field), field
    with HostManager(devices) as host:
        plan = host.add_network("bert", TRANSFORMER, partition="balanced")
        graph = host.graph("bert")
        assert len(plan.partitions) == 4
        names = [n for p in plan.partitions for n in p.nodes]
        assert sorted(names) == sorted(graph.by_name) and len(set(names)) == len(names)
        produced = set(graph.inputs) | set(graph.initializers)
        for p in plan.partitions:  # topological order: inputs come from earlier partitions
            assert isinstance(p.name, str) and p.device in host.devices
            assert p.backend == "cpu"
            assert set(p.inputs) <= produced | set(graph.initializers), p.name
            produced |= set(p.outputs)
            assert p.weight_bytes >= 0 and p.activation_bytes > 0 and p.est_seconds > 0
        assert set(graph.outputs) <= produced
        assert plan.transfers
        for t in plan.transfers:
            assert {t.src, t.dst} <= set(host.devices) and t.src != t.dst
            assert isinstance(t.tensor, str) and t.bytes > 0 and t.est_seconds > 0
        assert plan.bottleneck_seconds > 0
        assert plan.bottleneck_seconds >= max(p.est_seconds for p in plan.partitions)
        d = json.loads(json.dumps(plan.to_dict()))
        assert [p["name"] for p in d["partitions"]] == [p.name for p in plan.partitions]
        for p in d["partitions"]:
            for field in ("name", "nodes", "device", "backend", "inputs", "outputs",
                          "weight_bytes", "activation_bytes", "est_seconds"):
                assert field in p, field
        for t in d["transfers"]:
            for field in ("tensor", "src", "dst", "bytes", "est_seconds"):
                assert field in t, field
        assert d["bottleneck_seconds"] == plan.bottleneck_seconds
        dot = plan.to_dot()
        assert dot.startswith("digraph") and dot.rstrip().endswith("}")
        assert dot.count("subgraph") == len(plan.partitions)


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


# -- errors ----------------------------------------------------------------------------------


def test_queue_full():
    host, gate = gated_toy(max_active=1, max_queue=2)
    with host:
        first = Blocked(host, gate)
        feeds = [toy_feeds() for _ in range(2)]
        queued = [host.run("toy", f) for f in feeds]
        assert not any(f.done() for f in queued)
        with pytest.raises(QueueFullError, match="full"):
            host.run("toy", toy_feeds())
        gate.opened.set()
        np.testing.assert_allclose(first.future().result(timeout=WAIT)["y"],
                                   toy_expected(first.feeds))
        for f, fut in zip(feeds, queued, strict=True):
            np.testing.assert_allclose(fut.result(timeout=WAIT)["y"], toy_expected(f))
        assert poll(lambda: idle(host))
        host.run("toy", toy_feeds()).result(timeout=WAIT)  # room again


def test_timeout_while_queued_never_runs():
    host, gate = gated_toy(max_active=1)
    with host:
        events = Events(host)
        first = Blocked(host, gate)
        late = host.run("toy", toy_feeds(), timeout=0.05)
        late_id = events.last_queued()
        err = late.exception(timeout=5)  # ends while the gate is still shut
        assert isinstance(err, RequestTimeoutError) and "queue" in str(err)
        assert not gate.opened.is_set()
        gate.opened.set()
        first.future().result(timeout=WAIT)
        after = toy_feeds()
        np.testing.assert_allclose(host.run("toy", after).result(timeout=WAIT)["y"],
                                   toy_expected(after))
        assert poll(lambda: idle(host))
        time.sleep(0.05)
        assert not events.ran(late_id)
        assert not any(e.get("request") == late_id for e in events.of("request.started"))
        assert gate.calls == 2


def test_timeout_while_running():
    host, gate = gated_toy(max_active=1)
    with host:
        events = Events(host, kinds=("request.",))
        blocked = Blocked(host, gate, timeout=0.05)
        rid = events.last_queued()
        assert poll(lambda: any(e["request"] == rid for e in events.of("request.failed")), 5)
        opened_at = time.monotonic()
        gate.opened.set()
        err = blocked.future().exception(timeout=WAIT)
        assert isinstance(err, RequestTimeoutError) and "running" in str(err)
        [failed] = [e for e in events.of("request.failed") if e["request"] == rid]
        assert failed.ts < opened_at
        after = toy_feeds()
        np.testing.assert_allclose(host.run("toy", after).result(timeout=WAIT)["y"],
                                   toy_expected(after))
        assert poll(lambda: idle(host))


def test_invalid_input_dtype_and_shape_say_expected_and_given():
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("mlp", MLP)
        good = np.zeros((2, 256), np.float32)
        messages = []
        with pytest.raises(InvalidInputError) as e:
            host.run("mlp", {"x": good.astype(np.float64)})
        assert "expected" in str(e.value) and "float32" in str(e.value)
        assert "float64" in str(e.value)
        messages.append(str(e.value))
        with pytest.raises(InvalidInputError) as e:
            host.run("mlp", {"x": np.zeros((2, 255), np.float32)})
        assert "expected" in str(e.value) and "256" in str(e.value) and "255" in str(e.value)
        messages.append(str(e.value))
        with pytest.raises(InvalidInputError) as e:
            host.run("mlp", {"x": np.zeros((2, 1, 256), np.float32)})
        assert "expected" in str(e.value)
        messages.append(str(e.value))
        with pytest.raises(InvalidInputError, match="missing"):
            host.run("mlp", {})
        with pytest.raises(InvalidInputError, match="'y'"):  # unknown beside a good one
            host.run("mlp", {"x": good, "y": good})
        assert all("\n" not in m for m in messages)
        assert idle(host)
        feeds = {"x": good + 1}
        assert_same(host.run("mlp", feeds).result(timeout=WAIT), expected(MLP, feeds))


def test_inputs_like_ones_accepted_before_are_still_checked_in_full():
    """An input's dtype and shape, once accepted, are remembered: what comes later in
    that shape must still be refused for a wrong dtype, name or extra input."""
    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("mlp", MLP)
        good = rng.standard_normal((int(rng.integers(1, 4)), 256)).astype(np.float32)
        assert_same(host.run("mlp", {"x": good}).result(timeout=WAIT),
                    expected(MLP, {"x": good}))
        for bad, said in (({"x": good.astype(np.float64)}, "float64"), ({"y": good}, "'y'"),
                          ({"x": good, "y": good}, "'y'"), ({"x": good[:, :255]}, "255")):
            with pytest.raises(InvalidInputError, match=said):
                host.run("mlp", bad)
        assert idle(host)


def test_invalid_input_name_says_expected_and_given():
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("mlp", MLP)
        with pytest.raises(InvalidInputError) as e:
            host.run("mlp", {"y": np.zeros((2, 256), np.float32)})
        message = str(e.value)
        assert "'x'" in message, message  # what it expects
        assert "'y'" in message, message  # what it was given


def test_network_not_found_and_exists():
    with HostManager(parse_devices("cpu:2")) as host:
        for call in (lambda: host.run("nope", {}), lambda: host.plan("nope"),
                     lambda: host.graph("nope"), lambda: host.remove_network("nope")):
            with pytest.raises(NetworkNotFoundError, match="nope"):
                call()
        host.add_network("m", MLP)
        used = {n: m.used_bytes for n, m in host.devices.items()}
        with pytest.raises(NetworkExistsError, match="m"):
            host.add_network("m", MLP)
        with pytest.raises(NetworkExistsError):
            host.add_network("m", TRANSFORMER)
        assert {n: m.used_bytes for n, m in host.devices.items()} == used
        assert host.networks() == ["m"]
        feeds = {"x": np.ones((2, 256), np.float32)}
        assert_same(host.run("m", feeds).result(timeout=WAIT), expected(MLP, feeds))


def test_remove_while_busy():
    host, gate = gated_toy(max_active=1)
    with host:
        events = Events(host, kinds=("provision.evicted",))
        blocked = Blocked(host, gate)
        with pytest.raises(NetworkBusyError):
            host.remove_network("toy", wait=False)
        with pytest.raises(NetworkBusyError):  # a short wait gives up and leaves it loaded
            host.remove_network("toy", wait=True, timeout=0.05)
        assert host.networks() == ["toy"]
        remover = threading.Thread(target=host.remove_network, args=("toy",),
                                   kwargs={"wait": True, "timeout": WAIT})
        remover.start()
        time.sleep(0.1)
        assert remover.is_alive()
        assert sum(m.used_bytes for m in host.devices.values()) > 0
        with pytest.raises(NetworkNotFoundError):  # no new requests while it is removed
            host.run("toy", toy_feeds())
        gate.opened.set()
        remover.join(WAIT)
        assert not remover.is_alive()
        np.testing.assert_allclose(blocked.future().result(timeout=WAIT)["y"],
                                   toy_expected(blocked.feeds))
        assert host.networks() == []
        assert {n: m.used_bytes for n, m in host.devices.items()} == {"cpu0": 0, "cpu1": 0}
        assert {n: m.keys for n, m in host.devices.items()} == {"cpu0": (), "cpu1": ()}
        assert len(events.of("provision.evicted")) == 2
        host.add_network("toy", toy_chain(), partition=TOY_MAP)  # the name is free again
        f = toy_feeds()
        np.testing.assert_allclose(host.run("toy", f).result(timeout=WAIT)["y"],
                                   toy_expected(f))


def test_close_with_requests_pending():
    host, gate = gated_toy(max_active=1)
    blocked = Blocked(host, gate)
    queued = [host.run("toy", toy_feeds()) for _ in range(4)]
    bound = 0.3
    closer = threading.Thread(target=host.close, args=(bound,), daemon=True)
    start = time.monotonic()
    closer.start()
    try:
        assert poll(lambda: all(f.done() for f in queued), bound + 2.0)
        assert time.monotonic() - start < bound + 1.0
        for fut in queued:
            assert isinstance(fut.exception(timeout=0), HostClosedError)
    finally:
        gate.opened.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    # the running one was accepted too: it ends, with its outputs or HostClosedError
    running = blocked.future()
    assert running.done()
    err = running.exception(timeout=0)
    assert err is None or isinstance(err, HostClosedError), err
    host.close()  # twice is fine


def test_closed_host_refuses_with_host_closed_error():
    host = HostManager(parse_devices("cpu:2"))
    host.add_network("m", MLP)
    host.close()
    with pytest.raises(HostClosedError):
        host.add_network("again", MLP)
    with pytest.raises(HostClosedError):
        host.run("m", {"x": np.zeros((1, 256), np.float32)})


def test_close_lets_accepted_requests_finish():
    host, gate = gated_toy(max_active=1)
    feeds = [toy_feeds() for _ in range(3)]
    blocked = Blocked(host, gate)
    queued = [host.run("toy", f) for f in feeds]
    threading.Timer(0.1, gate.opened.set).start()
    host.close(timeout=WAIT)
    np.testing.assert_allclose(blocked.future().result(timeout=0)["y"],
                               toy_expected(blocked.feeds))
    for f, fut in zip(feeds, queued, strict=True):
        np.testing.assert_allclose(fut.result(timeout=0)["y"], toy_expected(f))


def test_cancel_queued_request():
    host, gate = gated_toy(max_active=1)
    with host:
        events = Events(host)
        blocked = Blocked(host, gate)
        victim = host.run("toy", toy_feeds())
        victim_id = events.last_queued()
        kept_feeds = toy_feeds()
        kept = host.run("toy", kept_feeds)
        assert victim.cancel()
        assert victim.cancelled()
        assert host.stats().queued == 1
        gate.opened.set()
        blocked.future().result(timeout=WAIT)
        np.testing.assert_allclose(kept.result(timeout=WAIT)["y"], toy_expected(kept_feeds))
        assert poll(lambda: idle(host))
        for _ in range(5):  # accounting recovered: later requests still run
            f = toy_feeds()
            np.testing.assert_allclose(host.run("toy", f).result(timeout=WAIT)["y"],
                                       toy_expected(f))
        assert poll(lambda: idle(host))
        assert not events.ran(victim_id)
        assert not any(e.get("request") == victim_id for e in events.of("request.started"))
        assert gate.calls == 7


# -- priorities ------------------------------------------------------------------------------


def test_priority_then_fifo():
    host, gate = gated_toy(max_active=1, max_queue=20)
    with host:
        events = Events(host, kinds=("request.",))
        blocked = Blocked(host, gate)
        first_id = events.last_queued()
        low, high = [], []
        for _ in range(3):
            low.append((host.run("toy", toy_feeds(), priority=1), events.last_queued()))
        for _ in range(3):
            high.append((host.run("toy", toy_feeds(), priority=0), events.last_queued()))
        low.append((host.run("toy", toy_feeds(), priority=1), events.last_queued()))
        gate.opened.set()
        blocked.future().result(timeout=WAIT)
        for fut, _ in [*low, *high]:
            fut.result(timeout=WAIT)
        order = [e["request"] for e in events.of("request.started")]
        want = [first_id, *(i for _, i in high), *(i for _, i in low)]
        assert order == want


# -- events ----------------------------------------------------------------------------------


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


# -- every request ends exactly once -----------------------------------------------------------


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


def test_devices_dict_and_stats():
    with HostManager(parse_devices("cpu:2,sim:2")) as host:
        assert set(host.devices) == {"cpu0", "cpu1", "sim0", "sim1"}
        plan = host.add_network("m", MLP, partition="balanced")
        used = {p.device: 0 for p in plan.partitions}
        for p in plan.partitions:
            used[p.device] += p.weight_bytes + p.activation_bytes
        for name, m in host.devices.items():
            s = m.stats()
            assert s.used_bytes == used.get(name, 0) == m.used_bytes
            assert s.total_bytes == m.config.memory_bytes
        host.run("m", {"x": np.ones((2, 256), np.float32)}).result(timeout=WAIT)
        assert sum(m.stats().runs for m in host.devices.values()) == len(plan.partitions)


def test_dataclass_fields_are_named_as_designed():
    from runtime.partition import Partition, Transfer

    assert {"name", "nodes", "device", "backend", "inputs", "outputs", "weight_bytes",
            "activation_bytes", "est_seconds"} <= {f.name for f in dataclasses.fields(Partition)}
    assert {"tensor", "src", "dst", "bytes", "est_seconds"} <= {
        f.name for f in dataclasses.fields(Transfer)}


# -- the one-partition lean path and request memory ------------------------------------------


def test_lean_path_outputs_errors_and_futures_behave_like_any_future():
    """A one-partition plan on an idle device runs on the caller's thread and returns a
    future born finished: it must work with every concurrent.futures helper, and a fault
    must still name partition and device."""
    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:1")) as host:
        plan = host.add_network("t", TRANSFORMER)
        assert len(plan.partitions) == 1
        feeds = [{"tokens": rng.standard_normal((2, 16, 64)).astype(np.float32)}
                 for _ in range(5)]
        futures = [host.run("t", f) for f in feeds]
        assert all(f.done() for f in futures), "the lean path should answer at once"
        done, pending = cf.wait(futures, timeout=WAIT)
        assert len(done) == 5 and not pending
        assert len(list(cf.as_completed(futures, timeout=WAIT))) == 5
        called = []
        futures[0].add_done_callback(called.append)
        assert called == [futures[0]] and not futures[0].cancel()
        for f, fut in zip(feeds, futures, strict=True):
            assert_same(fut.result(timeout=0), expected(TRANSFORMER, f))
    with faked("cpu:1") as host:
        [part] = host.add_network("t", TRANSFORMER).partitions
        host.devices[part.device].fail = lambda n, _: n == 2
        outcomes = [host.run("t", f) for f in feeds[:3]]
        assert all(f.done() for f in outcomes), "the lean path should answer at once"
        err = outcomes[1].exception(timeout=0)
        assert isinstance(err, ExecutionError) and f"t/{part.name}" in str(err)
        assert (err.partition, err.device) == (part.name, part.device)
        assert_same(outcomes[2].result(timeout=0), expected(TRANSFORMER, feeds[2]))
        stats = host.stats()
        assert (stats.slots_used, stats.queued, stats.outstanding) == (0, 0, {"t": 0})


def one_op(op: str, declared: list, *, shape: list[int] | None = None) -> onnx.ModelProto:
    """x [b, 4] -> `op` -> y, y declared as `declared` (Reshape: to the constant `shape`)."""
    inputs, inits = ["x"], []
    if shape is not None:
        inputs.append("shape")
        inits.append(onnx.numpy_helper.from_array(np.array(shape, np.int64), "shape"))
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"])], op.lower(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, declared)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_the_lean_path_on_onnxruntime_checks_names_counts_and_steps_aside(monkeypatch):
    """On onnxruntime the lean path runs on the caller's thread: what comes back is checked
    against the declared outputs, a failure names partition and device, its runs are the
    device's, bad feeds are refused before the device is waited for, and it steps aside
    (to the general path) for a closed device or a device's own thread."""
    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("relu", one_op("Relu", ["b", 4]))
        host.add_network("narrow", one_op("Relu", ["b", 3]))  # declares fewer columns
        host.add_network("fold", one_op("Reshape", [3, "n"], shape=[3, -1]))
        device = host.devices["cpu0"]
        runs = device.stats().runs
        for rows in (1, 2, 5):
            x = rng.standard_normal((rows, 4)).astype(np.float32)
            future = host.run("relu", {"x": x})
            assert future.done(), "an idle device runs it on the caller's thread"
            np.testing.assert_array_equal(future.result(timeout=0)["y"], np.maximum(x, 0))
        assert device.stats().runs == runs + 3 and device.stats().busy_seconds > 0
        bad = host.run("narrow", {"x": rng.standard_normal((2, 4)).astype(np.float32)})
        error = bad.exception(timeout=0)
        assert isinstance(error, ExecutionError) and "bad result" in str(error)
        assert "[2, 4]" in str(error) and (error.partition, error.device) == ("p0", "cpu0")
        x = rng.standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_array_equal(host.infer("fold", {"x": x})["y"], x.reshape(3, -1))
        failed = host.run("fold", {"x": x[:2]}).exception(timeout=0)
        assert isinstance(failed, ExecutionError) and "cannot be reshaped" in str(failed)
        assert "\n" not in str(failed) and (failed.partition, failed.device) == ("p0", "cpu0")
        with pytest.raises(InvalidInputError, match="input 'x' of relu"):
            host.run("relu", {"x": x[:, :3]})
        assert host.run("relu", {"x": x}).done(), "refused feeds left the device held"
        monkeypatch.setattr(lean, "LEAN_WAIT", 60.0)  # were it to wait, it would wait long
        with device._running:  # the device busy: refused at once, not after waiting for it
            began = time.monotonic()
            with pytest.raises(InvalidInputError, match="input 'x' of relu"):
                host.run("relu", {"x": x[:, :3]})
            assert time.monotonic() - began < WAIT

        inner: list = []

        def again(_):  # on the device's worker: it must queue, not run here
            inner.append(host.run("relu", {"x": x}))
            inner.append(inner[0].done())

        outer = host.run("relu", {"x": x}, inline=False)
        outer.add_done_callback(again)
        outer.result(timeout=WAIT)
        assert poll(lambda: len(inner) == 2) and inner[1] is False
        np.testing.assert_array_equal(inner[0].result(timeout=WAIT)["y"], np.maximum(x, 0))
        device.close(1.0)
        closed = host.run("relu", {"x": x}).exception(timeout=WAIT)
        assert isinstance(closed, ExecutionError) and "closed" in str(closed)


@pytest.mark.parametrize("batching", [None, {"max_batch_size": 4, "max_queue_delay_ms": 1}])
def test_an_answered_request_is_freed_without_the_garbage_collector(batching):
    """No reference cycle outlives a request: with the collector off, its future dies with
    the last reference to it (a cycle per request once cost a collection every few
    hundred requests)."""
    import gc
    import weakref

    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:2")) as host:
        host.add_network("m", MLP, batching=batching)
        host.infer("m", {"x": rng.standard_normal((1, 256)).astype(np.float32)})
        gc.collect()
        gc.disable()
        try:
            refs = []
            for inline in (True, False):
                future = host.run("m", {"x": rng.standard_normal((1, 256)).astype(np.float32)},
                                  timeout=WAIT, inline=inline)
                future.result(timeout=WAIT)
                refs.append(weakref.ref(future))
                del future
            assert poll(lambda: all(r() is None for r in refs)), "a request lives in a cycle"
        finally:
            gc.enable()


# -- devices the host is given ------------------------------------------------------------------


def test_host_takes_device_instances_attaches_its_bus_and_closes_them():
    devices = [FakeDevice(config) for config in parse_devices("cpu:2")]
    host = HostManager(devices)
    with host:
        assert list(host.devices.values()) == devices
        assert all(d.bus is host.bus for d in devices)
        events = Events(host, kinds=("partition.run.finished", "device.memory"))
        plan = host.add_network("m", MLP, partition="balanced")
        feeds = {"x": np.random.default_rng().standard_normal((2, 256)).astype(np.float32)}
        assert_same(host.run("m", feeds).result(timeout=WAIT), expected(MLP, feeds))
        assert poll(lambda: len(events.of("partition.run.finished")) == len(plan.partitions))
        assert {e["device"] for e in events.of("device.memory")} == {
            p.device for p in plan.partitions}
    with pytest.raises(ExecutionError, match="closed"):
        blocking(devices[0], "anything", feeds)
    with pytest.raises(PrismError, match="cpu0"):
        HostManager([*parse_devices("cpu:1"), *parse_devices("cpu:1")])
