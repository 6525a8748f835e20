"""The device guard, through the host: whatever a device's run does (raises anything, a
KeyboardInterrupt included; returns an output missing, mistyped or misshapen; never
answers), no device stays busy and no request stays open. A failure names partition,
device and what was wrong; a stuck run times out (on by default) and holds no slot; a
failed batch fails only the requests that fail alone. Faults come from fake devices:
`FakeDevice` (a Device from scratch, as a device in another process) and
`FaultyManager` (the real in-process device with faults where its function runs)."""

from __future__ import annotations

import math
import threading

import numpy as np
import onnxruntime as ort
import pytest

from runtime.devices import parse_devices
from runtime.errors import ExecutionError, HostClosedError, PrismError, RequestTimeoutError
from runtime.executor.futures import ReadyFuture
from runtime.host import HostManager
from tests.support.classifiers import stumps_declared_flat
from tests.support.fakes import FakeDevice, FaultyManager, Gate, cut, retyped, without
from tests.support.serving import MLP, TRANSFORMER, WAIT, Events, assert_same, expected, idle, poll

FACTORIES = pytest.mark.parametrize("factory", [FakeDevice, FaultyManager],
                                    ids=["fake", "manager"])


def host_on(factory, spec: str = "cpu:2", **kw) -> HostManager:
    return HostManager(parse_devices(spec), device_factory=factory, **kw)


def mlp(rng, rows: int = 2) -> dict:
    return {"x": rng.standard_normal((rows, 256)).astype(np.float32)}


def tokens(rng) -> dict:
    return {"tokens": rng.standard_normal((2, 16, 64)).astype(np.float32)}


def serves(host: HostManager, network: str, model, make, count: int = 20, wait: float = WAIT,
           **kw) -> None:
    """`count` requests one after another, each answered right within `wait`."""
    rng = np.random.default_rng()
    for _ in range(count):
        feeds = make(rng)
        assert_same(host.run(network, feeds, **kw).result(timeout=wait), expected(model, feeds))


def closes_within(host: HostManager, timeout: float) -> None:
    """`host.close(timeout)` returns within its bound (and a margin for a busy machine)."""
    closer = threading.Thread(target=host.close, kwargs={"timeout": timeout}, daemon=True)
    closer.start()
    closer.join(timeout + 3)
    assert not closer.is_alive(), f"close(timeout={timeout}) did not return"


def on_device(name: str) -> dict:
    """A user map putting the whole network on one device."""
    return {"default": name}


# -- anything a run raises ---------------------------------------------------------------------


@FACTORIES
def test_a_keyboard_interrupt_in_an_inline_run_reaches_the_caller_and_the_device_stays_usable(
        factory):
    """The issue's probe: Ctrl-C landing in a run on the caller's thread left the device
    busy, the next request pending for ever and close(timeout=2) taking 7 s."""
    rng = np.random.default_rng()
    host = host_on(factory, "cpu:1")
    [part] = host.add_network("m", MLP).partitions
    host.devices[part.device].fail = lambda call, feeds: KeyboardInterrupt if call == 1 else 0
    with pytest.raises(KeyboardInterrupt):
        host.run("m", mlp(rng))  # the lean path: no Request record, nothing left open
    stats = host.stats()
    assert (stats.slots_used, stats.queued, stats.outstanding) == (0, 0, {"m": 0})
    serves(host, "m", MLP, mlp)
    serves(host, "m", MLP, mlp, inline=False)
    closes_within(host, 2)


@FACTORIES
def test_a_keyboard_interrupt_in_an_inline_first_stage_ends_its_request_naming_where(factory):
    rng = np.random.default_rng()
    host = host_on(factory, "cpu:2")
    first, _ = host.add_network("m", MLP).partitions
    events = Events(host, kinds=("request.", "partition.run.finished"))
    host.devices[first.device].fail = lambda call, feeds: KeyboardInterrupt if call == 1 else 0
    with pytest.raises(KeyboardInterrupt):
        host.run("m", mlp(rng))
    [failed] = events.of("request.failed")
    assert (failed["partition"], failed["device"]) == (first.name, first.device)
    assert "KeyboardInterrupt" in failed["error"] and f"m/{first.name}" in failed["error"]
    [run] = events.of("partition.run.finished")  # a dashboard sees the run end
    assert run["ok"] is False and run["device"] == first.device
    assert idle(host) and host.stats().outstanding == {"m": 0}
    serves(host, "m", MLP, mlp)
    closes_within(host, 2)


@pytest.mark.parametrize("fault", [KeyboardInterrupt, SystemExit(3), GeneratorExit],
                         ids=["interrupt", "exit", "generator-exit"])
def test_a_base_exception_on_a_device_worker_fails_that_run_and_a_new_worker_takes_over(fault):
    """The issue's probe: raised on a worker thread, it killed the thread and every later
    request on the device hung (20 of 20)."""
    name = fault.__name__ if isinstance(fault, type) else f"{type(fault).__name__}: {fault}"
    rng = np.random.default_rng()
    with host_on(FaultyManager, "cpu:1", max_active=21) as host:
        [part] = host.add_network("m", MLP).partitions
        events = Events(host, kinds=("device.worker.replaced", "request.failed"))
        device = host.devices[part.device]
        device.gate = Gate()  # the first run waits until 20 more are queued behind it
        device.fail = lambda call, feeds: fault if call == 1 else 0
        dying = host.run("m", mlp(rng), inline=False)
        assert device.gate.entered.wait(WAIT)
        futures = [(f, host.run("m", f, inline=False)) for f in (mlp(rng) for _ in range(20))]
        device.gate.opened.set()
        err = dying.exception(timeout=WAIT)
        assert isinstance(err, ExecutionError), err
        assert (err.partition, err.device) == (part.name, part.device)
        assert name in str(err) and f"m/{part.name}" in str(err)
        for feeds, fut in futures:  # the queue goes on, on a new worker
            assert_same(fut.result(timeout=WAIT), expected(MLP, feeds))
        [replaced] = events.of("device.worker.replaced")
        assert replaced["device"] == part.device and replaced["error"] == name
        assert len(events.of("request.failed")) == 1
        assert poll(lambda: idle(host))


# -- outputs checked against what the partition declares ----------------------------------------

MANGLES = {"missing": (without(), "is missing"),
           "dtype": (retyped(np.float64), "is float64 ["),
           "shape": (cut(1), ", declared float32 [batch, 16, 64]")}


@pytest.mark.parametrize(("kind", "path"), [
    (kind, path) for kind in MANGLES for path in ("lean", "inline", "queued")
    if (kind, path) != ("shape", "lean")])  # the lean path's outputs are the graph's
def test_a_bad_output_fails_its_request_naming_partition_device_and_what(kind, path):
    """Nothing checked outputs: a missing one left its requests pending until close().
    A graph output's declared shape is a hint, as onnxruntime reads it: a cut tensor's
    is checked (the partition in the middle of three)."""
    mangle, text = MANGLES[kind]
    rng = np.random.default_rng()
    with host_on(FakeDevice, "cpu:1" if path == "lean" else "cpu:3") as host:
        plan = host.add_network("t", TRANSFORMER)
        part = plan.partitions[len(plan.partitions) // 2]
        host.devices[part.device].mangle = lambda call, feeds, outputs: (
            mangle(call, feeds, outputs) if call % 2 else outputs)
        for i in range(1, 7):  # one at a time: request i is the partition's call i
            feeds = tokens(rng)
            fut = host.run("t", feeds, inline=path != "queued")
            assert isinstance(fut, ReadyFuture) == (path == "lean")
            if i % 2:
                err = fut.exception(timeout=WAIT)
                assert isinstance(err, ExecutionError), err
                assert (err.partition, err.device) == (part.name, part.device)
                assert f"t/{part.name}" in str(err) and text in str(err)
                assert "returned a bad result" in str(err)
            else:
                assert_same(fut.result(timeout=WAIT), expected(TRANSFORMER, feeds))
        assert poll(lambda: idle(host))


@pytest.mark.parametrize("spec", ["cpu:1", "cpu:2", "reference:1"])
def test_a_graph_output_made_in_another_shape_than_declared_is_answered_as_onnxruntime_does(
        spec):
    """A graph output's declared shape is a hint to onnxruntime: it warns and answers."""
    rng = np.random.default_rng()
    model = stumps_declared_flat(5, 6, rng)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with HostManager(parse_devices(spec)) as host:
        host.add_network("stumps", model)
        for rows in (1, 4):
            x = rng.standard_normal((rows, 6)).astype(np.float32)
            [want] = session.run(None, {"features": x})
            got = host.infer("stumps", {"features": x}, timeout=WAIT)["predictions"]
            assert got.shape == want.shape == (rows, 1)
            np.testing.assert_allclose(got, want, rtol=1e-6)


# -- batches ---------------------------------------------------------------------------------


def marked(rng, rows: int = 1) -> dict:
    feeds = mlp(rng, rows)
    feeds["x"][:, 0] = 1000.0
    return feeds


def is_marked(feeds: dict) -> bool:
    return bool(np.any(feeds["x"][:, 0] == 1000.0))


@FACTORIES
def test_one_failing_request_fails_alone_and_the_rest_of_its_batch_is_answered(factory):
    rng = np.random.default_rng()
    with host_on(factory, "cpu:1", max_queue=100) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 8, "max_queue_delay_ms": 100})
        device = host.devices["cpu0"]
        events = Events(host, kinds=("request.",))
        device.gate = Gate()
        held = host.run("m", mlp(rng, 1))  # a batch of one, held: the next 8 batch up
        assert device.gate.entered.wait(WAIT)
        feeds = [mlp(rng, 1) for _ in range(8)]
        feeds[3] = marked(rng)
        device.fail = lambda call, f: is_marked(f)
        futures = [host.run("m", f) for f in feeds]
        device.gate.opened.set()
        held.result(timeout=WAIT)
        for i, (f, fut) in enumerate(zip(feeds, futures, strict=True)):
            if i == 3:
                err = fut.exception(timeout=WAIT)
                assert isinstance(err, ExecutionError) and "injected fault" in str(err)
                assert (err.partition, err.device) == ("p0", "cpu0")
            else:
                assert_same(fut.result(timeout=WAIT), expected(MLP, f))
        rows = ([shape[0] for _, shape, _ in device.runs] if factory is FakeDevice
                else None)
        if rows is not None:  # the batch, then each of its requests alone, in order
            assert rows == [1, 8] + [1] * 8, rows
        started = [e["request"] for e in events.of("request.started")]
        assert len(started) == len(set(started)) == 9  # a retry is no second start
        assert poll(lambda: idle(host))


def test_faults_fail_only_the_requests_whose_own_run_failed():
    """The issue's count: 31 faults injected under batching failed 248 requests. Now a
    request fails only when a run of it alone fails."""
    with host_on(FakeDevice, "cpu:1", max_queue=1000) as host:
        host.add_network("m", MLP, batching={"max_batch_size": 8, "max_queue_delay_ms": 2})
        device = host.devices["cpu0"]
        device.fail = lambda call, feeds: call % 7 == 0
        lock, sent = threading.Lock(), []

        def client(seed: int) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(25):
                feeds = mlp(rng, 1)
                fut = host.run("m", feeds)
                with lock:
                    sent.append((feeds, fut))
                fut.exception(timeout=WAIT)

        threads = [threading.Thread(target=client, args=(s,)) for s in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        failed = 0
        for feeds, fut in sent:
            err = fut.exception(timeout=WAIT)
            if err is None:
                assert_same(fut.result(), expected(MLP, feeds))
            else:
                assert isinstance(err, ExecutionError) and "injected fault" in str(err)
                failed += 1
        faulted = [shape[0] for n, (_, shape, _) in enumerate(device.runs, 1) if n % 7 == 0]
        assert any(rows > 1 for rows in faulted), "no batch of several failed"
        assert failed == sum(rows == 1 for rows in faulted)
        assert len(sent) == 400


def test_a_batch_that_comes_back_with_the_wrong_rows_is_an_error_not_a_wrong_split():
    rng = np.random.default_rng()
    with host_on(FakeDevice, "cpu:1") as host:
        host.add_network("m", MLP, batching={"max_batch_size": 8, "max_queue_delay_ms": 1})
        host.devices["cpu0"].mangle = cut(0)  # a row short: passes the symbolic batch dim
        err = host.run("m", mlp(rng, 3)).exception(timeout=WAIT)
        assert isinstance(err, ExecutionError)
        assert str(err) == "a batch of 3 rows to m came back with 2 rows of 'logits'"
        host.devices["cpu0"].mangle = None
        serves(host, "m", MLP, mlp, count=3)


# -- timeouts ------------------------------------------------------------------------------------


def test_a_stuck_run_times_out_by_default_and_its_late_answer_is_dropped():
    rng = np.random.default_rng()
    with host_on(FakeDevice, "cpu:2", timeout=0.2) as host:
        _, second = host.add_network("m", MLP).partitions
        events = Events(host, kinds=("request.",))
        gate = host.devices[second.device].gate = Gate()
        fut = host.run("m", mlp(rng))
        err = fut.exception(timeout=WAIT)
        assert isinstance(err, RequestTimeoutError) and "running" in str(err), err
        assert not gate.opened.is_set() and idle(host)  # its slot is back, the run still held
        gate.opened.set()  # the device answers late
        assert poll(lambda: len(host.devices[second.device].runs) == 1 and idle(host))
        host.devices[second.device].gate = None
        serves(host, "m", MLP, mlp, count=3)
        rid = events.of("request.queued")[0]["request"]
        ends = [e for e in events.all() if e.kind in ("request.finished", "request.failed")
                and e["request"] == rid]
        assert [e.kind for e in ends] == ["request.failed"]


def test_timeouts_come_from_the_request_its_network_or_the_host_and_inf_turns_them_off():
    rng = np.random.default_rng()
    with host_on(FakeDevice, "cpu:1", timeout=0.3) as host:
        for name, timeout in (("host", None), ("net", 0.1), ("never", math.inf)):
            host.add_network(name, MLP, timeout=timeout)
        gate = host.devices["cpu0"].gate = Gate()
        never = host.run("never", mlp(rng), inline=False)  # holds the device at the gate
        assert gate.entered.wait(WAIT)
        futures = {name: host.run(name, mlp(rng)) for name in ("host", "net")}
        futures["own"] = host.run("never", mlp(rng), timeout=0.2)
        for name, at_least in (("net", 0.1), ("own", 0.2), ("host", 0.3)):
            err = futures[name].exception(timeout=WAIT)
            assert isinstance(err, RequestTimeoutError), (name, err)
            took = float(str(err).split("after ")[1].split(" s")[0])
            assert took >= at_least * 0.999, (name, str(err))
        assert not never.done()  # no timeout: it waits for its device
        gate.opened.set()
        assert never.result(timeout=WAIT)["logits"].shape == (2, 10)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "5", True])
def test_a_timeout_that_is_not_a_positive_number_is_refused_naming_it(bad):
    with pytest.raises(PrismError, match="HostManager timeout must be a number of seconds"):
        HostManager(parse_devices("cpu:1"), timeout=bad)
    with host_on(FakeDevice, "cpu:1") as host:
        with pytest.raises(PrismError, match="timeout of m must be a number of seconds"):
            host.add_network("m", MLP, timeout=bad)
        assert host.networks() == []
        host.add_network("m", MLP)
        with pytest.raises(PrismError, match=r"above 0 \(math.inf: none\), got"):
            host.run("m", mlp(np.random.default_rng()), timeout=bad)
        assert idle(host) and host.stats().outstanding == {"m": 0}


def test_the_lean_path_keeps_its_speed_with_a_timeout_and_drops_a_late_answer():
    """A run on the caller's own thread cannot be answered sooner than it returns: the
    deadline is checked when it does, so a timeout (the default included) keeps requests
    on the lean path, and an answer past it ends the request timed out."""
    rng = np.random.default_rng()
    with host_on(FaultyManager, "cpu:1") as host:
        host.add_network("m", MLP)
        device = host.devices["cpu0"]
        feeds = mlp(rng)
        fut = host.run("m", feeds)  # the default timeout
        assert isinstance(fut, ReadyFuture)
        assert_same(fut.result(timeout=0), expected(MLP, feeds))
        device.gate = Gate()
        threading.Timer(0.1, device.gate.opened.set).start()
        late = host.run("m", mlp(rng), timeout=0.02)  # returns when the run does
        assert isinstance(late, ReadyFuture) and device.gate.opened.is_set()
        err = late.exception(timeout=0)
        assert isinstance(err, RequestTimeoutError) and "running" in str(err)
        device.gate = None
        serves(host, "m", MLP, mlp, count=3, timeout=5)
        assert idle(host)


@pytest.mark.parametrize("batching", [None, {"max_batch_size": 4, "max_queue_delay_ms": 1}],
                         ids=["unbatched", "batched"])
def test_a_stuck_device_holds_no_slot_from_requests_on_other_devices(batching):
    """One slot in all: a request stuck on cpu0 gives it back when it times out (a batch,
    when its last member has), so cpu1's network goes on while cpu0's run still hangs."""
    rng = np.random.default_rng()
    with host_on(FakeDevice, "cpu:2", max_active=1) as host:
        host.add_network("stuck", MLP, partition=on_device("cpu0"), batching=batching,
                         timeout=0.1)
        host.add_network("free", MLP, partition=on_device("cpu1"))
        gate = host.devices["cpu0"].gate = Gate()
        err = host.run("stuck", mlp(rng), inline=False).exception(timeout=WAIT)
        assert isinstance(err, RequestTimeoutError)
        serves(host, "free", MLP, mlp, count=5, wait=WAIT / 3)  # well before the gate gives up
        assert not gate.opened.is_set() and gate.calls == 1
        gate.opened.set()
        host.devices["cpu0"].gate = None
        serves(host, "stuck", MLP, mlp, count=3)  # after its late answer, cpu0 serves again
        assert poll(lambda: idle(host))


def test_close_returns_within_its_bound_with_a_run_stuck_and_fails_what_is_open():
    rng = np.random.default_rng()
    host = host_on(FakeDevice, "cpu:2")
    host.add_network("m", MLP)
    gate = host.devices["cpu1"].gate = Gate()
    futures = [host.run("m", mlp(rng), inline=False) for _ in range(3)]
    assert gate.entered.wait(WAIT)
    closes_within(host, 0.5)
    for fut in futures:
        assert isinstance(fut.exception(timeout=WAIT), HostClosedError)
    gate.opened.set()
