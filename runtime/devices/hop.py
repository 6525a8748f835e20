"""What dispatching one run to a device costs it: a thread hand-off for an in-process
device, a Ray call for an actor. Measured the way partitions run: a trivial program on
two devices of a kind, many requests in flight, each run's `done` queueing the next
device's run as the executor does; the hop is the time per request beyond the program's
own run.

    hop = measure_hop([host.devices["cpu0"], host.devices["cpu1"]])   # seconds, or None
    hop = process_hop(config)          # a `cpu` kind on devices opened for the purpose
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence

import numpy as np

from runtime.devices.config import DeviceConfig
from runtime.devices.device import Device, Program
from runtime.errors import PrismError

PROBE_KEY = "prism/hop-probe"
PROBE_RUNS = 300
PROBE_TIMEOUT = 20.0  # seconds: a probe that has not finished by then measured nothing


@functools.cache
def probe_program() -> Program:
    """y = Identity(x): a run that does next to nothing."""
    import onnx
    from onnx import TensorProto, helper

    from runtime.devices.ort.sessions import loadable

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="probe")],
                              "hop-probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return Program.of(loadable(model), 0, 64)


def measure_hop(devices: Sequence[Device], runs: int = PROBE_RUNS) -> float | None:
    """Seconds one run's dispatch costs a device of this kind (pipelined, so what a
    stage pays per request, not the latency of one call), or None if the probe could not
    run (a device refused it, or it took longer than PROBE_TIMEOUT)."""
    chain = list(devices[:2])
    if not chain:
        return None
    loaded: list[Device] = []
    try:
        for device in chain:
            device.load(PROBE_KEY, probe_program())
            loaded.append(device)
        feeds = {"x": np.zeros((1, 4), np.float32)}
        _pipelined(chain, feeds, 20)  # warm: sessions, threads, the actor's first calls
        before = [d.stats() for d in chain]
        wall = _pipelined(chain, feeds, runs)
        after = [d.stats() for d in chain]
    except PrismError:
        return None
    finally:
        for device in loaded:
            device.unload(PROBE_KEY)
    if wall is None:
        return None
    own = max((b.busy_seconds - a.busy_seconds) / max(b.runs - a.runs, 1)
              for a, b in zip(before, after, strict=True))
    return max(wall / runs - own, 0.0)


def _pipelined(chain: list[Device], feeds: dict, runs: int) -> float | None:
    """Wall seconds for `runs` requests through the chain, all sent at once; None if they
    did not all finish within PROBE_TIMEOUT or one failed."""
    finished = threading.Event()
    state = {"done": 0, "failed": False}
    lock = threading.Lock()

    def landed(stage: int, outputs, error) -> None:
        if error is not None or outputs is None:
            state["failed"] = True
            finished.set()
            return
        if stage + 1 < len(chain):
            chain[stage + 1].call(PROBE_KEY, {"x": outputs["y"]}, None,
                                  lambda o, e: landed(stage + 1, o, e))
            return
        with lock:
            state["done"] += 1
            if state["done"] == runs:
                finished.set()

    start = time.perf_counter()
    for _ in range(runs):
        chain[0].call(PROBE_KEY, feeds, None, lambda o, e: landed(0, o, e))
    if not finished.wait(PROBE_TIMEOUT) or state["failed"]:
        return None
    return time.perf_counter() - start


@functools.cache
def process_hop(threads: int = 1, spin: bool = True) -> float | None:
    """The hop of in-process `cpu` devices at `threads` (and `spin`), on two opened for
    the purpose."""
    from runtime.devices.backends import open_device

    devices = [open_device(DeviceConfig(name=f"hop-probe{i}", backend="cpu", threads=threads,
                                        spin=spin)) for i in range(2)]
    try:
        return measure_hop(devices)
    finally:
        for device in devices:
            device.close(1.0)
