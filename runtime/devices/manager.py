"""DeviceManager: a device in this process. It compiles programs here (with its backend's
compiler) and runs them one at a time, in arrival order, on a worker thread of its own.

`run_now` on an idle device runs right on the caller's thread (a thread hand-off costs
tens of microseconds). Asked to `wait`, a caller finding the device busy waits for it as
for a lock, then runs on its own thread: one lock and one wake-up per run, as for a session
behind a lock, where a run on the worker costs two wake-ups and a Future. Like a lock it
is not fair: a caller back at once may take the device before a woken one, which keeps
the device busy instead of idle through a wake-up.

`inline_program` hands a program's parts (the run lock, onnxruntime's binding, the account) to
the lean path, which does what `run_now` does inside its own frame.

A thread running a job, worker or inline caller, counts as a device thread meanwhile, so
work chained onward from inside a run queues on the next device instead of running the
whole chain on one thread.

Guarded: whatever a run raises, the device is idle again afterwards. An Exception fails
that run (an ExecutionError naming device and program). A BaseException that is not one
(KeyboardInterrupt landing during an inline run, SystemExit) passes through to the caller
of `run_now`, whose thread it was meant for; on the worker it fails the run in hand and
ends the thread, and a fresh worker takes over the queue (`device.worker.replaced`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np

from runtime.devices.config import DeviceConfig
from runtime.devices.device import (
    Device,
    DeviceStats,
    Done,
    InlineProgram,
    Outputs,
    Program,
    RunAccount,
    Tag,
)
from runtime.errors import ExecutionError, ProvisionError, described, first_line

__all__ = ["Compiler", "DeviceManager", "DeviceStats", "Function", "on_device_thread"]

log = logging.getLogger(__name__)

class _Local(threading.local):
    device = False  # this thread runs a device's job now (a worker, or a caller inline)


_local = _Local()
_IDLE_POLL = 0.5  # bound on each worker wait; close() also wakes it


def on_device_thread() -> bool:
    """True on a device worker, and on a caller while it runs a job inline."""
    return _local.device


class Function(Protocol):
    """A program compiled for one device: `run` returns every output, by name."""

    output_names: tuple[str, ...]

    def run(self, feeds: dict[str, np.ndarray]) -> Outputs: ...

    # optional: `raw(output names, feeds, None)` -> those outputs as a list, with no Python
    # in between (onnxruntime's binding), for `DeviceManager.inline_program`


Compiler = Callable[[Program, DeviceConfig], Function]


@dataclass(slots=True)
class _Job:
    key: str
    feeds: dict[str, np.ndarray]
    tag: Tag | None
    done: Done
    arrived: float


class DeviceManager(Device):
    def __init__(self, config: DeviceConfig, compile: Compiler, bus: Any = None):
        super().__init__(config, bus)
        self._compile = compile
        self._functions: dict[str, Function] = {}
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_Job] = deque()
        self._running = threading.Lock()  # held through each run: the device is busy
        self._closed = False
        self._worker: threading.Thread | None = None
        self._tally = RunAccount()
        self._inline: dict[str, InlineProgram] = {}  # handed out by `inline_program`
        self._plain = type(self)._invoke is DeviceManager._invoke  # a modelled device's is not

    def _install(self, key: str, program: Program) -> None:
        if self._closed:
            raise ProvisionError(f"cannot load {key}: device {self.name} is closed")
        function = self._compile(program, self.config)
        with self._cond:
            self._functions[key] = function

    def _uninstall(self, key: str) -> None:
        with self._cond:
            self._functions.pop(key, None)
            if (program := self._inline.pop(key, None)) is not None:
                program.live = False

    # -- runs ----------------------------------------------------------------------------

    def run_now(self, key: str, feeds: dict[str, np.ndarray], tag: Tag | None = None,
                wait: float = 0.0) -> Outputs | None:
        if not self._hold(wait):
            return None
        try:  # from the moment the device is held: Ctrl-C may land on any line
            if self._closed:
                return None
            _local.device = True
            outputs, error = self._run(key, feeds, tag, time.perf_counter())
        finally:
            _local.device = False
            self._running.release()
        if error is not None:
            raise error
        return outputs

    def _hold(self, wait: float) -> bool:
        """Take the device for a run on this thread: at once when it is idle and nothing
        is queued, or within `wait` seconds in its line; never on a device's own thread (a
        function that forwards to another device must queue there)."""
        if self._closed or _local.device:
            return False
        if wait > 0:
            return self._running.acquire(True, wait)
        return not self._queue and self._running.acquire(blocking=False)

    def inline_program(self, key: str) -> InlineProgram | None:
        """For a device that keeps no time of its own, running a function with a `raw`
        binding (onnxruntime's)."""
        function = self._functions.get(key)
        call = getattr(function, "raw", None)
        if not self._plain or call is None:
            return None
        with self._cond:
            if self._closed:
                return None
            program = self._inline.get(key)
            if program is None:
                program = self._inline[key] = InlineProgram(
                    self._running, call, _local, self._tally, partial(self._failed, key))
        return program

    def call(self, key: str, feeds: dict[str, np.ndarray], tag: Tag | None, done: Done
             ) -> None:
        """Queue for the worker thread, which calls `done` (no Future: the executor chains
        its stages this way, a Future's locks costing microseconds per stage)."""
        job = _Job(key, feeds, tag, done, time.perf_counter())
        with self._cond:
            closed = self._closed
            if not closed:
                self._queue.append(job)
                self._ensure_worker()
                self._cond.notify_all()
        if closed:
            done(None, ExecutionError(f"device {self.name} closed"))

    def stats(self) -> DeviceStats:
        return self._stats(self._tally.runs, self._tally.busy_seconds, len(self._queue))

    def close(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            for program in self._inline.values():
                program.live = False
            dropped = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
            worker = self._worker
        for job in dropped:
            _settle(job, None, ExecutionError(f"device {self.name} closed"))
        if worker is not None and worker is not threading.current_thread():
            worker.join(max(0.0, deadline - time.monotonic()))
        # The run in hand, on the worker or some caller's thread:
        if self._running.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._running.release()

    def _ensure_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name=f"prism-{self.name}",
                                            daemon=True)
            self._worker.start()

    def _work(self) -> None:
        _local.device = True
        job: _Job | None = None
        try:
            while True:
                with self._cond:
                    while not self._closed and not self._queue:
                        self._cond.wait(_IDLE_POLL)
                    if not self._queue:
                        return  # closed and drained
                    job = self._queue.popleft()
                self._running.acquire()  # held by a run on a caller's thread, at most
                try:
                    outputs, error = self._run(job.key, job.feeds, job.tag, job.arrived)
                finally:
                    self._running.release()
                answer, job = job, None  # answered from here on: never twice
                _settle(answer, outputs, error)
                del answer, outputs  # an idle worker must not pin the last request's tensors
        except BaseException as exc:  # the thread dies: fail the run in hand, replace it
            self._replace(job, exc)

    def _replace(self, job: _Job | None, exc: BaseException) -> None:
        """The worker is dying of `exc`: its run (if not yet answered) fails, and unless the
        device is closed a fresh worker takes the queue over."""
        what = described(exc)
        log.warning("the worker of %s died (%s); replacing it", self.name, what)
        with self._cond:
            self._worker = None
            if not self._closed:
                self._ensure_worker()
        if self.publishing:
            self.publish("device.worker.replaced", device=self.name, error=what)
        if job is not None:
            _settle(job, None, ExecutionError(f"{self.name} failed running {job.key}: {what} "
                                              f"(its worker thread died and was replaced)"))

    def _run(self, key: str, feeds: dict[str, np.ndarray], tag: Tag | None, arrived: float
             ) -> tuple[Outputs | None, ExecutionError | None]:
        """Run with `_running` held (its caller releases it) and publish the run's events.
        Whatever passes through here (an interrupt while an event is published, say), the
        run's figures and its finished event are kept."""
        tagged = tag if tag is not None and self.publishing else None
        start = time.perf_counter()
        error: ExecutionError | None = None
        outputs: Outputs | None = None
        try:
            if tagged is not None:
                self.publish("partition.run.started", **tagged, device=self.name)
            function = self._functions.get(key)
            if function is None:
                raise LookupError(f"{key} is not loaded")
            outputs = self._invoke(key, function, feeds, arrived)
        except Exception as exc:
            error = self._failed(key, exc)
        finally:  # also when a BaseException passes: the device must not stay busy
            end = time.perf_counter()
            self._tally.runs += 1  # under `_running`, as every run
            self._tally.busy_seconds += end - start
            if tagged is not None:
                self.publish("partition.run.finished", **tagged, device=self.name,
                             queue_wait=start - arrived, run_seconds=end - start,
                             ok=outputs is not None)
        return outputs, error

    def _failed(self, key: str, exc: Exception) -> ExecutionError:
        error = ExecutionError(f"{self.name} failed running {key}: {first_line(exc)}")
        error.__cause__ = exc
        return error

    def _invoke(self, key: str, function: Function, feeds: dict[str, np.ndarray],
                arrived: float) -> Outputs:
        """One run of a loaded function; a modelled device overrides this to keep time."""
        return function.run(feeds)


def _settle(job: _Job, outputs: Outputs | None, error: ExecutionError | None) -> None:
    try:
        job.done(outputs, error)
    except Exception:  # as a Future would: a broken callback must not stop the device
        log.exception("callback of %s failed", job.key)
