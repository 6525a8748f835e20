"""Hosts for tests: a host on fake devices, a two-partition toy network whose second
partition waits at a gate (so requests can be held running while others queue), and a
look at where each replica of a network was loaded and what every device holds, and at
what the process holds and burns.

    host, gate = gated_toy(max_active=1)   # toy: cpu0 -> cpu1, cpu1's runs held at `gate`
    first = Blocked(host, gate)            # one request, held running at the gate
    queued = host.run("toy", toy_feeds())  # waits for the slot `first` holds
    gate.opened.set()
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from runtime.devices import DeviceConfig, parse_devices
from runtime.host import HostManager
from tests.support.fakes import FakeDevice, Gate
from tests.support.serving import WAIT


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


def faked(spec: str = "cpu:1", **kw) -> HostManager:
    """A host on fake devices with the figures of `spec`: real values (from onnxruntime),
    injectable faults."""
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


def sims(n: int, **kw) -> list[DeviceConfig]:
    """n twin sim devices, sim0..sim{n-1}, with the figures given."""
    return [DeviceConfig(name=f"sim{i}", backend="sim", **kw) for i in range(n)]


def replicas_by_device(host: HostManager, network: str) -> dict[str, set[str]]:
    """replica tag ('' for the first, '#1', ...) -> the devices holding its partitions."""
    out: dict[str, set[str]] = {}
    for name, manager in host.devices.items():
        for key in manager.keys:
            head = key.split("/")[0]
            if head == network or head.startswith(network + "#"):
                out.setdefault(head[len(network):], set()).add(name)
    return out


def used(host: HostManager) -> dict[str, int]:
    """Device name -> the bytes it holds."""
    return {name: m.used_bytes for name, m in host.devices.items()}


def resident_bytes(pid: int | str = "self") -> int:
    """A process's resident memory now (this one's by default), in bytes."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_burnt_after(run: Callable[[], object]) -> float:
    """The process's CPU seconds in the 0.1 s after `run` returns (the least of five: other
    threads of the test process only add): what threads spinning between runs take."""
    burnt = []
    for _ in range(5):
        run()
        start = time.process_time()
        time.sleep(0.1)
        burnt.append(time.process_time() - start)
    return min(burnt)
