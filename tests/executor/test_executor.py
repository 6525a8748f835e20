"""The executor's own paths, driven directly over fake devices: a request's first stage on
the caller's thread and the rest through the devices' queues (`call`), or every stage on
the caller's thread for a caller that waits (`infer`, branches still at once), the lean
`run_now`, errors that name their partition and device, and a request that ends
mid-flight."""

from __future__ import annotations

import threading
from functools import partial

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from runtime.devices import parse_devices
from runtime.errors import ExecutionError
from runtime.executor.requests import Request
from runtime.host import HostManager
from runtime.observe.events import EventBus
from runtime.provision.from_model import load_network
from runtime.provision.network import LoadedNetwork
from tests.support.fakes import FakeDevice, Gate
from tests.support.serving import MLP, TRANSFORMER, WAIT, assert_same, expected


class Outcome:
    """A `done` callback that records each call and signals the first."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.event = threading.Event()

    def __call__(self, request, outputs, error):
        self.calls.append((request, outputs, error))
        self.event.set()

    def wait(self) -> tuple:
        assert self.event.wait(WAIT), "done was never called"
        return self.calls[0]


@pytest.fixture
def loaded():
    """(network, its devices) on fake cpu devices; closed afterwards."""
    made: list[dict] = []

    def load(model, spec: str, **kw) -> tuple[LoadedNetwork, dict[str, FakeDevice]]:
        devices = {c.name: FakeDevice(c) for c in parse_devices(spec)}
        made.append(devices)
        return load_network("t", model, devices, EventBus(), **kw), devices

    yield load
    for devices in made:
        for device in devices.values():
            device.close()


def tokens(rng) -> dict:
    return {"tokens": rng.standard_normal((2, 16, 64)).astype(np.float32)}


def test_first_stage_runs_on_the_caller_and_the_rest_on_device_threads(loaded):
    net, devices = loaded(TRANSFORMER, "cpu:3")
    [executor] = net.replicas
    assert len(executor.parts) == 3 and not executor.single
    rng = np.random.default_rng()
    feeds = tokens(rng)
    request, outcome = Request("t", feeds, inline=True), Outcome()
    executor.start(request, outcome)
    got, outputs, error = outcome.wait()
    assert got is request and error is None
    assert_same(outputs, expected(TRANSFORMER, feeds))
    threads = {p.partition.name: devices[p.device.name].runs[-1][2] for p in executor.parts}
    first, *rest = (p.partition.name for p in executor.parts)
    assert threads[first] == threading.current_thread().name
    assert all(threads[name].startswith("fake-") for name in rest), threads
    assert len(outcome.calls) == 1
    # not inline: every stage through the queues, none on this thread
    queued, outcome = Request("t", feeds := tokens(rng)), Outcome()
    executor.start(queued, outcome)
    assert_same(outcome.wait()[1], expected(TRANSFORMER, feeds))
    assert all(d.runs[-1][2].startswith("fake-") for d in devices.values())


def test_a_request_its_caller_waits_for_runs_every_stage_on_the_caller(loaded):
    """Its caller sends nothing else meanwhile (`HostManager.infer`): each stage whose
    device is idle runs right here, sparing two thread hand-offs a stage."""
    net, devices = loaded(TRANSFORMER, "cpu:3")
    [executor] = net.replicas
    feeds = tokens(np.random.default_rng())
    request, outcome = Request("t", feeds, inline=True, waited=True), Outcome()
    executor.start(request, outcome)
    assert_same(outcome.wait()[1], expected(TRANSFORMER, feeds))
    assert {d.runs[-1][2] for d in devices.values()} == {threading.current_thread().name}


def _diamond() -> tuple[onnx.ModelProto, dict]:
    """relu -> (neg, sigmoid) -> add, a partition a node, each on a device of its own."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Neg", ["r"], ["n"], name="neg"),
             helper.make_node("Sigmoid", ["r"], ["s"], name="sigmoid"),
             helper.make_node("Add", ["n", "s"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "diamond",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    mapping = {"partitions": {f"p{i}": f"cpu{i}" for i in range(4)},
               "nodes": {n.name: f"p{i}" for i, n in enumerate(nodes)}}
    return model, mapping


def test_branches_run_at_once_while_one_runs_on_the_caller(loaded):
    """Of two partitions made ready together, the one sent to its device's thread goes
    before the other runs here: both are held running at once."""
    model, mapping = _diamond()
    net, devices = loaded(model, "cpu:4", partition=mapping)
    [executor] = net.replicas
    gates = {name: Gate() for name in ("cpu1", "cpu2")}
    for name, gate in gates.items():
        devices[name].gate = gate
    x = np.random.default_rng().standard_normal(4).astype(np.float32)
    outcome = Outcome()
    caller = threading.Thread(target=executor.start, name="caller", args=(
        Request("t", {"x": x}, inline=True, waited=True), outcome))
    caller.start()
    try:
        assert all(g.entered.wait(5) for g in gates.values()), "the branches ran one by one"
    finally:
        for gate in gates.values():
            gate.opened.set()
        caller.join(WAIT)
    r = np.maximum(x, 0)
    # sigmoid(r) - r cancels near r = 0.5: a float32 rounding of either side (onnxruntime's
    # Sigmoid is not numpy's) is an absolute error there, 6e-8 seen on -0.013
    np.testing.assert_allclose(outcome.wait()[1]["y"], 1 / (1 + np.exp(-r)) - r, rtol=1e-6,
                               atol=1e-6)
    threads = sorted(devices[name].runs[-1][2] for name in gates)
    assert threads[0] == "caller" and threads[1].startswith("fake-"), threads


def test_an_error_names_its_partition_and_device_and_abandons_the_rest(loaded):
    net, devices = loaded(TRANSFORMER, "cpu:3")
    [executor] = net.replicas
    middle, last = executor.parts[1], executor.parts[2]
    devices[middle.device.name].fail = lambda n, feeds: True
    outcome = Outcome()
    executor.start(Request("t", tokens(np.random.default_rng()), inline=True), outcome)
    _, outputs, error = outcome.wait()
    assert outputs is None and isinstance(error, ExecutionError)
    assert (error.partition, error.device) == (middle.partition.name, middle.device.name)
    assert "injected fault" in str(error)
    assert devices[last.device.name].runs == []
    assert len(outcome.calls) == 1


def test_a_request_ended_mid_flight_runs_no_further_stage(loaded):
    net, devices = loaded(TRANSFORMER, "cpu:3")
    [executor] = net.replicas
    first, second = executor.parts[0], executor.parts[1]
    gate = devices[first.device.name].gate = Gate()
    request, outcome = Request("t", tokens(np.random.default_rng())), Outcome()
    executor.start(request, outcome)
    assert gate.entered.wait(5)
    assert request.claim()  # as the host's deadline would
    request.settle(None, TimeoutError("gone"))
    gate.opened.set()
    assert not outcome.event.wait(0.2)
    assert devices[second.device.name].runs == [] and outcome.calls == []


def test_run_now_is_the_lean_path_of_a_one_partition_plan(loaded):
    net, devices = loaded(MLP, "cpu:1")
    [executor] = net.replicas
    assert executor.single and net.lean is executor
    [device] = devices.values()
    rng = np.random.default_rng()
    feeds = {"x": rng.standard_normal((3, 256)).astype(np.float32)}
    assert_same(executor.run_now(feeds), expected(MLP, feeds))
    assert device.runs[-1][2] == threading.current_thread().name
    gate = device.gate = Gate()
    outcome = Outcome()
    executor.start(Request("t", feeds), outcome)  # holds the device on its thread
    assert gate.entered.wait(5)
    assert executor.run_now(feeds) is None  # busy: the host takes the general path
    gate.opened.set()
    assert_same(outcome.wait()[1], expected(MLP, feeds))
    device.gate, device.fail = None, lambda n, feeds: True
    with pytest.raises(ExecutionError) as info:
        executor.run_now(feeds)
    part = executor.parts[0]
    assert (info.value.partition, info.value.device) == (part.partition.name, "cpu0")


def test_a_host_on_devices_that_never_run_inline_still_serves():
    """A device in another process cannot run on the caller's thread: its run_now always
    declines, and the host must serve through `call` alone."""
    rng = np.random.default_rng()
    factory = partial(FakeDevice, inline=False)
    with HostManager(parse_devices("cpu:2"), device_factory=factory) as host:
        for model, make in ((MLP, lambda: {"x": rng.standard_normal((2, 256)).astype(
                np.float32)}), (TRANSFORMER, lambda: tokens(rng))):
            host.add_network(model.stem, model)
            feeds = [make() for _ in range(20)]
            futures = [host.run(model.stem, f) for f in feeds]
            for f, fut in zip(feeds, futures, strict=True):
                assert_same(fut.result(timeout=WAIT), expected(model, f))
        threads = {run[2] for d in host.devices.values() for run in d.runs}
        assert threading.current_thread().name not in threads
        assert sum(d.stats().runs for d in host.devices.values()) == sum(
            len(d.runs) for d in host.devices.values())


def test_infer_runs_each_stage_on_its_caller_and_run_pipelines_the_later_ones():
    """`infer` waits for its answer, so every stage whose device is idle runs on its
    thread; a future from `run` may be one of many the thread sends before it waits, so
    only its first stage does, the others pipelining on their devices' threads."""
    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:3"), device_factory=FakeDevice) as host:
        host.add_network("t", TRANSFORMER, partition="balanced", costs="model")
        parts = host.plan("t").partitions
        assert len(parts) == 3, [p.device for p in parts]
        here = threading.current_thread().name
        for call, waits in ((lambda f: host.infer("t", f), True),
                            (lambda f: host.run("t", f).result(timeout=WAIT), False)):
            feeds = tokens(rng)
            assert_same(call(feeds), expected(TRANSFORMER, feeds))
            first, *rest = (host.devices[p.device].runs[-1][2] for p in parts)
            assert first == here
            assert all((t == here) == waits and (t.startswith("fake-") != waits)
                       for t in rest), rest
