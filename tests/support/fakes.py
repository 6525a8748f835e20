"""Fake devices for tests: real values, injected faults and holds, and a record of runs.

`FakeDevice` implements the Device interface from scratch (no DeviceManager underneath),
which is what a device in another process will do, so a host that works on it works on
any device. `FaultyManager` is the real in-process device (a cpu DeviceManager) with the
same faults injected where its compiled function runs. Values come from onnxruntime, so
answers can be checked against the whole model.

    host = HostManager(parse_devices("cpu:3"), device_factory=FakeDevice)
    host.devices["cpu1"].fail = lambda call, feeds: call % 3 == 0   # raises ValueError
    host.devices["cpu1"].fail = lambda call, feeds: KeyboardInterrupt   # raises that
    host.devices["cpu1"].mangle = without("y")   # the run's outputs, altered
    host.devices["cpu1"].gate = Gate()      # its runs wait until gate.opened is set
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from runtime.devices import Device, DeviceManager, DeviceStats, Program
from runtime.devices.cpu import compile_cpu
from runtime.devices.ort.sessions import cpu_session
from runtime.devices.sim import SimDevice
from runtime.errors import ExecutionError, described, first_line
from runtime.types import Outputs, RunDone, Tag
from tests.support.serving import MARKS, WAIT

Mangle = Callable[[int, dict, Outputs], Outputs]


class Gate:
    """Holds every run that reaches it until opened."""

    def __init__(self, wait: float = WAIT):
        self.opened, self.entered = threading.Event(), threading.Event()
        self.wait = wait
        self.calls = 0

    def through(self) -> None:
        self.calls += 1
        self.entered.set()
        if not self.opened.wait(self.wait):
            raise RuntimeError("gate never opened")


class Faults:
    """What a test injects into a device's runs, by call number (1, 2, ...) and feeds:
    `fail(call, feeds)` true raises ValueError, or returns the exception (or class) to
    raise; `mangle(call, feeds, outputs)` alters what the run returns; `gate` holds runs."""

    fail: Callable[[int, dict], object] | None = None
    mangle: Mangle | None = None
    gate: Gate | None = None

    def _faulty(self, call: int, feeds: dict, compute: Callable[[], Outputs]) -> Outputs:
        if self.gate is not None:
            self.gate.through()
        if self.fail is not None and (fault := self.fail(call, feeds)):
            if isinstance(fault, BaseException) or (
                    isinstance(fault, type) and issubclass(fault, BaseException)):
                raise fault
            raise ValueError(f"injected fault on call {call}")
        outputs = compute()
        return outputs if self.mangle is None else self.mangle(call, feeds, outputs)


def without(name: str | None = None) -> Mangle:
    """Outputs with `name` (default: the first) left out."""
    def mangle(call: int, feeds: dict, outputs: Outputs) -> Outputs:
        gone = name or next(iter(outputs))
        return {k: v for k, v in outputs.items() if k != gone}
    return mangle


def retyped(dtype: Any) -> Mangle:
    """Every output in another dtype."""
    return lambda call, feeds, outputs: {k: v.astype(dtype) for k, v in outputs.items()}


def cut(axis: int) -> Mangle:
    """Every output one shorter along `axis`: a wrong fixed dimension, or (the batch axis)
    a row missing."""
    return lambda call, feeds, outputs: {k: np.delete(v, 0, axis) for k, v in outputs.items()}


class _FaultyInvoke(Faults):
    """`Faults` injected where a DeviceManager runs its compiled function. `calls` counts
    runs."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.calls = 0
        self._count = threading.Lock()

    def _invoke(self, key: str, function: Any, feeds: dict, arrived: float) -> Outputs:
        with self._count:
            self.calls += 1
            call = self.calls
        run = super()._invoke  # type: ignore[misc]
        return self._faulty(call, feeds, lambda: run(key, function, feeds, arrived))


class FaultyManager(_FaultyInvoke, DeviceManager):
    """The real in-process device (a cpu DeviceManager), faults injected."""

    def __init__(self, config: Any, bus: Any = None):
        super().__init__(config, compile_cpu, bus)


class FaultySim(_FaultyInvoke, SimDevice):
    """The real modelled accelerator (it keeps its time), faults injected."""


def inject_marked(device: Faults, hold: float = 0.02) -> None:
    """Faults of every kind, each on the runs whose feeds carry its mark (`serving.mark`):
    in a batch, every run holding a marked request; alone, only that request's."""
    def marks(feeds: dict) -> set[str]:
        first = next(iter(feeds.values()))
        return {kind for kind, value in MARKS.items() if np.any(first[:, 0] == value)}

    def fail(call: int, feeds: dict) -> object:
        kinds = marks(feeds)
        if "hold" in kinds:
            time.sleep(hold)
        return "raise" in kinds or (KeyboardInterrupt if "interrupt" in kinds else 0)

    def mangle(call: int, feeds: dict, outputs: Outputs) -> Outputs:
        for kind, bad in (("missing", without()), ("dtype", retyped(np.float64)),
                          ("shape", cut(1))):
            if kind in marks(feeds):
                return bad(call, feeds, outputs)
        return outputs

    device.fail, device.mangle = fail, mangle


class FakeDevice(Faults, Device):
    """Runs on a worker thread of its own, one run at a time in arrival order; with
    `inline` (the default) an idle device also runs on the caller's thread, as a local
    device does. `Faults` as set; a BaseException raised in a run passes through an inline
    caller, and on the worker is answered as an error (as a device in another process
    would report it). `runs` records (key, shape of the first input, thread) per run."""

    def __init__(self, config: Any, bus: Any = None, *, inline: bool = True):
        super().__init__(config, bus)
        self.inline = inline
        self.runs: list[tuple[str, tuple[int, ...], str]] = []
        self._sessions: dict[str, ort.InferenceSession] = {}
        self._lock = threading.Condition()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0  # queued or running on the worker
        self._busy = self._closed = False
        self._busy_seconds = 0.0
        self._worker = threading.Thread(target=self._work, daemon=True,
                                        name=f"fake-{config.name}")
        self._worker.start()

    def _install(self, key: str, program: Program) -> None:
        self._sessions[key] = cpu_session(program.model, external=program.external)

    def _uninstall(self, key: str) -> None:
        self._sessions.pop(key, None)

    def call(self, key: str, feeds: dict[str, np.ndarray], tag: Tag | None, done: RunDone
             ) -> None:
        with self._lock:
            closed = self._closed
            self._pending += not closed
        if closed:
            done(None, ExecutionError(f"device {self.name} closed"))
        else:
            self._jobs.put((key, feeds, tag, done, time.perf_counter()))

    def run_now(self, key: str, feeds: dict[str, np.ndarray], tag: Tag | None = None,
                wait: float = 0.0) -> Outputs | None:
        with self._lock:
            if not self.inline or self._busy or self._pending or self._closed:
                return None
            self._busy = True
        outputs, error = self._run(key, feeds, tag, time.perf_counter(), inline=True)
        if error is not None:
            raise error
        return outputs

    def stats(self) -> DeviceStats:
        with self._lock:
            return self._stats(len(self.runs), self._busy_seconds, self._pending)

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._closed = True
        self._jobs.put(None)
        self._worker.join(timeout)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            key, feeds, tag, done, arrived = job
            with self._lock:  # wait out an inline run on some caller's thread
                self._lock.wait_for(lambda: not self._busy, WAIT)
                self._busy = True
            outputs, error = self._run(key, feeds, tag, arrived, inline=False)
            with self._lock:
                self._pending -= 1
            done(outputs, error)
        while not self._jobs.empty():  # closed: fail what is left
            if (job := self._jobs.get()) is not None:
                job[3](None, ExecutionError(f"device {self.name} closed"))

    def _run(self, key: str, feeds: dict[str, np.ndarray], tag: Tag | None, arrived: float,
             inline: bool) -> tuple[Outputs | None, ExecutionError | None]:
        """One run with `_busy` held: publishes its events, clears `_busy` however it
        ends."""
        start = time.perf_counter()
        if tag is not None and self.publishing:
            self.publish("partition.run.started", **tag, device=self.name)
        with self._lock:
            self.runs.append((key, np.shape(next(iter(feeds.values()), ())),
                              threading.current_thread().name))
            call = len(self.runs)
        outputs, error = None, None
        try:
            session = self._sessions[key]
            names = [o.name for o in session.get_outputs()]
            outputs = self._faulty(call, feeds, lambda: dict(zip(
                names, session.run(names, feeds), strict=True)))
        except Exception as exc:
            error = ExecutionError(f"{self.name} failed running {key}: {first_line(exc)}")
        except BaseException as exc:
            if inline:
                raise
            error = ExecutionError(f"{self.name} failed running {key}: {described(exc)}")
        finally:
            end = time.perf_counter()
            with self._lock:
                self._busy = False
                self._busy_seconds += end - start
                self._lock.notify_all()
            if tag is not None and self.publishing:
                self.publish("partition.run.finished", **tag, device=self.name,
                             queue_wait=start - arrived, run_seconds=end - start,
                             ok=outputs is not None)
        return outputs, error


def relu_program(weight_bytes: int = 0, activation_bytes: int = 0, width: int = 4) -> Program:
    """A real one-Relu program that claims the bytes given (a device accounts what it is
    told): fills a device's memory, or stands for any partition."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return Program.of(model, weight_bytes, activation_bytes)


def blocking(device: Device, key: str, feeds: dict, tag: Tag | None = None,
             timeout: float = WAIT) -> Outputs:
    """One run through `call`, waited for: its outputs, or its ExecutionError raised."""
    box: list = []
    landed = threading.Event()
    device.call(key, feeds, tag, lambda outputs, error: (box.extend((outputs, error)),
                                                         landed.set()))
    assert landed.wait(timeout), f"{key} on {device.name} never answered"
    outputs, error = box
    if error is not None:
        raise error
    return outputs
