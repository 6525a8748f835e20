"""DeviceManager: a device in this process. It compiles programs here (with its backend's
compiler) and runs them one at a time, in arrival order, on a worker thread of its own.

`run_now` on an idle device runs right on the caller's thread (a thread hand-off costs
tens of microseconds). Asked to `wait`, a caller finding the device busy waits for it as
for a lock, then runs on its own thread: one lock and one wake-up per run, as for a session
behind a lock, where a run on the worker costs two wake-ups and a Future. Like a lock it
is not fair: a caller back at once may take the device before a woken one, which keeps
the device busy instead of idle through a wake-up.

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
from queue import Empty, SimpleQueue
from typing import Any, Protocol

import numpy as np

from runtime.devices.config import DeviceConfig
from runtime.devices.device import Device, DeviceStats, Program
from runtime.errors import ExecutionError, ProvisionError, described, first_line
from runtime.types import Outputs, RunDone, Tag

__all__ = ["Compiler", "DeviceManager", "DeviceStats", "Function", "on_device_thread"]

log = logging.getLogger(__name__)

class _Local(threading.local):
    device = False  # this thread runs a device's job now (a worker, or a caller inline)


_local = _Local()
_IDLE_POLL = 0.5  # bound on each worker wait; close() also wakes it
_CLOSED = None  # what close() queues to wake the worker
RECENT_RUNS = 512  # run times kept per key for `recent_runs`, the newest


def on_device_thread() -> bool:
    """True on a device worker, and on a caller while it runs a job inline."""
    return _local.device


class Function(Protocol):
    """A program compiled for one device: `run` returns every output, by name."""

    output_names: tuple[str, ...]

    def run(self, feeds: dict[str, np.ndarray]) -> Outputs: ...


Compiler = Callable[[Program, DeviceConfig], Function]
# a loaded function's run, the device held: (feeds, tag, arrived) -> (outputs, error)
_Run = Callable[[dict[str, np.ndarray], "Tag | None", "float | None"],
                "tuple[Outputs | None, ExecutionError | None]"]


@dataclass(slots=True)
class RunAccount:
    """A device's runs and the seconds they took, counted with its run lock held."""

    runs: int = 0
    busy_seconds: float = 0.0


@dataclass(slots=True)
class RunTimes:
    """A loaded function's successful runs: how many, and the newest ones' seconds."""

    times: deque[float]
    count: int = 0


@dataclass(slots=True)
class _Job:
    key: str
    feeds: dict[str, np.ndarray]
    tag: Tag | None
    done: RunDone
    arrived: float


class DeviceManager(Device):
    keeps_resident = True

    def __init__(self, config: DeviceConfig, compile: Compiler, bus: Any = None):
        super().__init__(config, bus)
        self._compile = compile
        self._runs: dict[str, _Run] = {}  # key -> how its function runs (`_runner`)
        self._recent: dict[str, RunTimes] = {}  # key -> its successful runs
        # The worker's line: a C queue, as a Condition's notify costs microseconds of Python
        # a run; `_lock` makes closing and queueing one step each
        self._queue: SimpleQueue[_Job | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._next: _Job | None = None  # taken by the worker, which waits for the device
        self._running = threading.Lock()  # held through each run: the device is busy
        self._closed = False
        self._worker: threading.Thread | None = None
        self._tally = RunAccount()
        # a device keeping time of its own (`_invoke` overridden: `sim`) keeps no run times
        self._modelled = type(self)._invoke is not DeviceManager._invoke

    def _install(self, key: str, program: Program) -> None:
        if self._closed:
            raise ProvisionError(f"cannot load {key}: device {self.name} is closed")
        function = self._compile(program, self.config)
        if program.resident or program.writes:
            function = ResidentFunction(function, self._resident, program)
        run = self._runner(key, function)
        with self._lock:
            self._runs[key] = run

    def _uninstall(self, key: str) -> None:
        with self._lock:
            self._runs.pop(key, None)
            self._recent.pop(key, None)

    # -- runs ----------------------------------------------------------------------------

    def run_now(self, key: str, feeds: dict[str, np.ndarray], tag: Tag | None = None,
                wait: float = 0.0) -> Outputs | None:
        """The device is taken at once when it is idle and nothing is queued, or within
        `wait` seconds in its line; never on a device's own thread (a function that
        forwards to another device must queue there)."""
        local, running = _local, self._running
        if local.device or not (running.acquire(True, wait) if wait > 0 else
                                self._queue.empty() and running.acquire(False)):
            return None
        try:  # from the moment the device is held: Ctrl-C may land on any line
            if self._closed:
                return None
            local.device = True
            outputs, error = (self._runs.get(key) or self._unloaded(key))(feeds, tag, None)
        finally:
            local.device = False
            running.release()
        if error is not None:
            raise error
        return outputs

    def call(self, key: str, feeds: dict[str, np.ndarray], tag: Tag | None, done: RunDone
             ) -> None:
        """Queue for the worker thread, which calls `done` (no Future: the executor chains
        its stages this way, a Future's locks costing microseconds per stage)."""
        job = _Job(key, feeds, tag, done, time.perf_counter())
        with self._lock:
            closed = self._closed
            if not closed:
                self._queue.put(job)
                if self._worker is None:
                    self._ensure_worker()
        if closed:
            done(None, ExecutionError(f"device {self.name} closed"))

    def stats(self) -> DeviceStats:
        waiting = self._queue.qsize() + (self._next is not None)
        return self._stats(self._tally.runs, self._tally.busy_seconds, waiting)

    def recent_runs(self, key: str) -> tuple[int, list[float]] | None:
        timed = self._recent.get(key)
        if timed is None or self._modelled:
            return None  # not loaded, or a device keeping modelled time: see Device's
        return timed.count, list(timed.times)  # one C step under the GIL, as runs append

    def close(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            dropped = _taken(self._queue)
            worker = self._worker
            if worker is not None:
                self._queue.put(_CLOSED)
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
        queue = self._queue
        try:
            while True:
                try:
                    job = queue.get(timeout=_IDLE_POLL)
                except Empty:
                    job = None
                if self._closed:  # a job taken as it closed fails as the queued ones did
                    if job is not None:
                        answer, job = job, None
                        _settle(answer, None, ExecutionError(f"device {self.name} closed"))
                    return
                if job is None:
                    continue
                self._next = job
                self._running.acquire()  # held by a run on a caller's thread, at most
                self._next = None
                try:
                    run = self._runs.get(job.key) or self._unloaded(job.key)
                    outputs, error = run(job.feeds, job.tag, job.arrived)
                finally:
                    self._running.release()
                answer, job = job, None  # answered from here on: never twice
                answer.feeds = {}  # gone before the answer wakes anyone (ArenaDebt reads it)
                _settle(answer, outputs, error)
                del answer, outputs  # an idle worker must not pin the last request's tensors
        except BaseException as exc:  # the thread dies: fail the run in hand, replace it
            self._replace(job, exc)

    def _replace(self, job: _Job | None, exc: BaseException) -> None:
        """The worker is dying of `exc`: its run (if not yet answered) fails, and unless the
        device is closed a fresh worker takes the queue over."""
        what = described(exc)
        log.warning("the worker of %s died (%s); replacing it", self.name, what)
        with self._lock:
            self._worker = None
            if not self._closed:
                self._ensure_worker()
        if self.publishing:
            self.publish("device.worker.replaced", device=self.name, error=what)
        if job is not None:
            _settle(job, None, ExecutionError(f"{self.name} failed running {job.key}: {what} "
                                              f"(its worker thread died and was replaced)"))

    def _unloaded(self, key: str) -> _Run:
        """The run of a key not loaded: it fails, naming the key."""
        return lambda feeds, tag, arrived: (None, self._failed(
            key, LookupError(f"{key} is not loaded")))

    def _runner(self, key: str, function: Function) -> _Run:
        """How `function` runs, the device held (its caller releases it), on the worker or
        a caller's thread alike: counted, a failure an ExecutionError naming the device,
        and with a `tag`, its events published. `arrived`: when it was queued (None: now).
        Whatever passes through (an interrupt while an event is published, say), the run's
        figures and its finished event are kept. A closure over what every run reads."""
        tally, failed, clock = self._tally, self._failed, time.perf_counter
        # A device that keeps no time of its own runs the function straight: a frame less
        invoke = self._invoke if self._modelled else None
        call = function.run
        timed = self._recent[key] = RunTimes(deque(maxlen=RECENT_RUNS))
        recent = timed.times

        def run(feeds: dict[str, np.ndarray], tag: Tag | None, arrived: float | None
                ) -> tuple[Outputs | None, ExecutionError | None]:
            tagged = tag if tag is not None and self.publishing else None
            start = clock()
            error: ExecutionError | None = None
            outputs: Outputs | None = None
            try:
                if tagged is not None:  # its time is not the run's
                    self.publish("partition.run.started", **tagged, device=self.name)
                    start = clock()
                outputs = call(feeds) if invoke is None else invoke(
                    key, function, feeds, start if arrived is None else arrived)
            except Exception as exc:
                error = failed(key, exc)
            finally:  # also when a BaseException passes: the device must not stay busy
                took = clock() - start
                tally.runs += 1  # under `_running`, as every run
                tally.busy_seconds += took
                if outputs is not None:
                    recent.append(took)
                    timed.count += 1
                if tagged is not None:
                    self.publish("partition.run.finished", **tagged, device=self.name,
                                 queue_wait=0.0 if arrived is None else start - arrived,
                                 run_seconds=took, ok=outputs is not None)
            return outputs, error

        return run

    def _failed(self, key: str, exc: Exception) -> ExecutionError:
        error = ExecutionError(f"{self.name} failed running {key}: {first_line(exc)}")
        error.__cause__ = exc
        return error

    def _invoke(self, key: str, function: Function, feeds: dict[str, np.ndarray],
                arrived: float) -> Outputs:
        """One run of a loaded function; a modelled device overrides this to keep time."""
        return function.run(feeds)


class ResidentFunction:
    """A function whose resident inputs come from its device's store, and whose written
    outputs replace them there (all or none, after the run succeeded) instead of being
    returned. Runs on a device are one at a time, so nothing else writes meanwhile."""

    def __init__(self, function: Function, store: dict[str, np.ndarray], program: Program):
        self.function, self.store = function, store
        self.reads, self.writes = program.resident, dict(program.writes)
        self.output_names = tuple(n for n in function.output_names if n not in self.writes)

    def run(self, feeds: dict[str, np.ndarray]) -> Outputs:
        store = self.store
        outputs = self.function.run(type(feeds)(feeds, **{n: store[n] for n in self.reads}))
        written = {name: outputs.pop(out) for out, name in self.writes.items()}
        for name, value in written.items():
            old = store[name]
            if value.shape != old.shape or value.dtype != old.dtype:
                raise ValueError(f"resident {name} would change from {old.dtype}"
                                 f"{list(old.shape)} to {value.dtype}{list(value.shape)}")
        store.update(written)
        return outputs


def _taken(queue: SimpleQueue[_Job | None]) -> list[_Job]:
    """Every job in `queue`, taken out of it."""
    jobs: list[_Job] = []
    while True:
        try:
            job = queue.get_nowait()
        except Empty:
            return jobs
        if job is not None:
            jobs.append(job)


def _settle(job: _Job, outputs: Outputs | None, error: ExecutionError | None) -> None:
    try:
        job.done(outputs, error)
    except Exception:  # as a Future would: a broken callback must not stop the device
        log.exception("callback of %s failed", job.key)
