"""DeviceManager: one per device. Owns its memory account, its loaded functions and the
in-order execution of runs on it.

Runs go one at a time in arrival order. A run submitted to an idle device from an
ordinary thread executes right there (a thread hand-off costs tens of microseconds);
otherwise it queues for the device's own worker thread. A thread executing a run,
worker or inline caller, counts as a device thread until the run's future is settled,
so a done-callback that submits onward queues on the next device instead of running
the whole chain inline on one thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import numpy as np
import onnx

from runtime.devices.backends import Function, compiler
from runtime.devices.config import DeviceConfig
from runtime.devices.sim import hold_until
from runtime.errors import DeviceMemoryError, ExecutionError, ProvisionError, first_line
from runtime.units import human_bytes

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]

_local = threading.local()
_IDLE_POLL = 0.5  # bound on each worker wait; close() also wakes it


def on_device_thread() -> bool:
    """True on a device worker, and on a caller while it runs a job inline."""
    return getattr(_local, "device", False)


@dataclass(frozen=True)
class DeviceStats:
    name: str
    backend: str
    runs: int
    busy_seconds: float
    queue_length: int
    used_bytes: int
    total_bytes: int


@dataclass
class _Loaded:
    function: Function
    nbytes: int


Done = Callable[[Outputs | None, ExecutionError | None], None]


@dataclass(slots=True)
class _Job:
    key: str
    feeds: dict[str, np.ndarray]
    tag: dict | None
    future: Future | None = None  # submit's; a job queued by `call` has `done` instead
    done: Done | None = None
    submitted: float = field(default_factory=time.perf_counter)

    def settle(self, outputs: Outputs | None, error: ExecutionError | None) -> None:
        if self.future is None:
            try:
                self.done(outputs, error)
            except Exception:  # as a Future would: a broken callback must not stop the device
                log.exception("callback of %s failed", self.key)
        elif error is None:
            self.future.set_result(outputs)
        else:
            self.future.set_exception(error)


class DeviceManager:
    def __init__(self, config: DeviceConfig, bus=None):
        self.config = config
        self.name = config.name
        self._bus = bus
        self._cond = threading.Condition(threading.Lock())
        self._loaded: dict[str, _Loaded] = {}
        self._pending: set[str] = set()  # keys being compiled; their bytes count as used
        self._used = 0
        self._bytes_w: dict[str, int] = {}  # key -> weight bytes (loaded or loading)
        self._bytes_a: dict[str, int] = {}  # key -> activation bytes
        self._queue: deque[_Job] = deque()
        self._busy = False
        self._closed = False
        self._worker: threading.Thread | None = None
        self._runs = 0
        self._busy_seconds = 0.0
        self._free_at = 0.0  # when a modelled device's last run ends on its timeline

    def __repr__(self) -> str:
        return f"DeviceManager({self.name}, {self.config.backend})"

    # memory account

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def free_bytes(self) -> int:
        return self.config.memory_bytes - self._used

    @property
    def keys(self) -> tuple[str, ...]:
        with self._cond:
            return tuple(self._loaded)

    def load(self, key: str, model: onnx.ModelProto, weight_bytes: int, activation_bytes: int,
             est_seconds: float = 0.0) -> None:
        """Compile `model` for this device and account its bytes; refuse before compiling."""
        unsupported = sorted({n.op_type for n in model.graph.node
                              if not self.config.can_run(n.op_type)})
        compile_ = compiler(self.config.backend)

        def build() -> Function:
            if unsupported:
                raise ProvisionError(f"{key} uses {', '.join(unsupported)}, which "
                                     f"{self.name} does not support")
            return compile_(model, self.config, est_seconds)

        self._install(key, build, int(weight_bytes), int(activation_bytes))

    def load_function(self, key: str, function: Function, weight_bytes: int = 0,
                      activation_bytes: int = 0) -> None:
        """Account and install an already compiled function (custom backends, tests)."""
        self._install(key, lambda: function, int(weight_bytes), int(activation_bytes))

    def _account(self) -> int:
        """Under the lock: weights add up; activations share one arena as large as the
        largest, since the device runs one function at a time."""
        self._used = sum(self._bytes_w.values()) + max(self._bytes_a.values(), default=0)
        return self._used

    def _install(self, key: str, build: Callable[[], Function], weights: int, acts: int
                 ) -> None:
        if weights < 0 or acts < 0:
            raise ProvisionError(f"{key}: negative byte count for {self.name}")
        with self._cond:
            if self._closed:
                raise ProvisionError(f"cannot load {key}: device {self.name} is closed")
            if key in self._loaded or key in self._pending:
                raise ProvisionError(f"{key} is already loaded on {self.name}")
            before = self._used
            self._bytes_w[key], self._bytes_a[key] = weights, acts
            if self._account() > self.config.memory_bytes:
                del self._bytes_w[key], self._bytes_a[key]
                self._account()
                raise DeviceMemoryError(
                    f"{key} needs {human_bytes(weights + max(0, acts - self._arena(key)))} "
                    f"on {self.name}, {human_bytes(self.config.memory_bytes - before)} free "
                    f"of {human_bytes(self.config.memory_bytes)}")
            self._pending.add(key)
        try:
            function = build()
        except BaseException:
            with self._cond:
                self._pending.discard(key)
                del self._bytes_w[key], self._bytes_a[key]
                self._account()
            raise
        with self._cond:
            self._pending.discard(key)
            self._loaded[key] = _Loaded(function, weights + acts)
        self.publish_memory()

    def _arena(self, without: str) -> int:
        return max((a for k, a in self._bytes_a.items() if k != without), default=0)

    def evict(self, key: str) -> int:
        """Forget `key` and free its bytes; returns the bytes freed (0 if not loaded)."""
        with self._cond:
            item = self._loaded.pop(key, None)
            if item is None:
                return 0
            before = self._used
            del self._bytes_w[key], self._bytes_a[key]
            freed = before - self._account()
        self.publish_memory()
        return freed

    # execution

    def run_now(self, key: str, feeds: dict[str, np.ndarray], tag: dict | None = None
                ) -> Outputs | None:
        """Run on the caller's thread if the device is idle, else None (then `submit`).

        No future, no hand-off: the cheapest way through an idle device. Raises
        ExecutionError if the run fails.
        """
        with self._cond:
            if self._closed or self._busy or self._queue or on_device_thread():
                return None
            self._busy = True
        outputs, error = self._call(key, feeds, tag, time.perf_counter())
        if error is not None:
            raise error
        return outputs

    def submit(self, key: str, feeds: dict[str, np.ndarray],
               tag: dict | None = None, inline: bool = True) -> Future:
        """Queue one run; the future gives every output by name or fails with ExecutionError.
        `inline=False` never runs it on the caller's thread.

        Never raises: a closed device returns an already-failed future, so a done-callback
        chaining runs across devices always gets an answer.
        """
        job = _Job(key, feeds, tag, Future())
        with self._cond:
            if self._closed:
                closed = True
            else:
                closed = False
                inline = (inline and not self._busy and not self._queue
                          and not on_device_thread())
                if inline:
                    self._busy = True
                else:
                    self._queue.append(job)
                    self._ensure_worker()
                    self._cond.notify_all()
        if closed:
            job.future.set_running_or_notify_cancel()
            job.future.set_exception(ExecutionError(f"device {self.name} closed"))
        elif inline:
            _local.device = True
            try:
                self._execute(job)
            finally:
                _local.device = False
        return job.future

    def call(self, key: str, feeds: dict[str, np.ndarray], tag: dict | None, done: Done) -> None:
        """Queue one run for the device's thread; `done(outputs, error)` is called there
        when it ends (or at once, here, if the device is closed). No Future: the executor
        chains its stages this way, a Future's locks costing microseconds per stage."""
        job = _Job(key, feeds, tag, done=done)
        with self._cond:
            closed = self._closed
            if not closed:
                self._queue.append(job)
                self._ensure_worker()
                self._cond.notify_all()
        if closed:
            done(None, ExecutionError(f"device {self.name} closed"))

    def run(self, key: str, feeds: dict[str, np.ndarray],
            timeout: float | None = None) -> Outputs:
        future = self.submit(key, feeds)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise ExecutionError(f"{self.name}: {key} did not finish within {timeout} s") from None

    def stats(self) -> DeviceStats:
        with self._cond:
            return DeviceStats(self.name, self.config.backend, self._runs, self._busy_seconds,
                               len(self._queue), self._used, self.config.memory_bytes)

    def close(self, timeout: float = 5.0) -> None:
        """Stop taking runs, fail queued ones, let the running one finish (within `timeout`)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
            worker = self._worker
        for job in dropped:
            if job.future is None or job.future.set_running_or_notify_cancel():
                job.settle(None, ExecutionError(f"device {self.name} closed"))
        if worker is not None and worker is not threading.current_thread():
            worker.join(max(0.0, deadline - time.monotonic()))
        with self._cond:  # an inline run on some caller's thread
            while self._busy and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)

    def _ensure_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name=f"prism-{self.name}",
                                            daemon=True)
            self._worker.start()

    def _work(self) -> None:
        _local.device = True
        while True:
            with self._cond:
                while not self._closed and (self._busy or not self._queue):
                    self._cond.wait(_IDLE_POLL)
                if not self._queue:
                    return  # closed and drained
                job = self._queue.popleft()
                self._busy = True
            self._execute(job)
            job = None  # an idle worker must not pin the last request's tensors

    def _execute(self, job: _Job) -> None:
        """Run one queued job with `_busy` held, then settle it (lock not held)."""
        if job.future is not None and not job.future.set_running_or_notify_cancel():
            self._idle(0.0, ran=False)
            return
        outputs, error = self._call(job.key, job.feeds, job.tag, job.submitted)
        job.settle(outputs, error)

    def _call(self, key: str, feeds: dict[str, np.ndarray], tag: dict | None,
              submitted: float) -> tuple[Outputs | None, ExecutionError | None]:
        """Run with `_busy` held; clears it and publishes the run's events."""
        tagged = tag is not None and self._bus_active()
        start = time.perf_counter()
        if tagged:
            self._publish("partition.run.started", **{**tag, "device": self.name})
        item = self._loaded.get(key)
        error: ExecutionError | None = None
        outputs: Outputs | None = None
        try:
            if item is None:
                raise LookupError(f"{key} is not loaded")
            outputs = item.function.run(feeds)
            modelled = getattr(item.function, "modelled_seconds", None)
            if modelled is not None:  # a modelled device: busy on its own timeline
                end_at = max(submitted, self._free_at) + modelled
                # Waking late is the host's lag, not device time: the next run may
                # start at end_at. Only real compute past end_at moves the device on.
                self._free_at = max(end_at, time.perf_counter())
                hold_until(end_at)
        except Exception as exc:
            error = ExecutionError(f"{self.name} failed running {key}: {first_line(exc)}")
            error.__cause__ = exc
        end = time.perf_counter()
        self._idle(end - start, ran=True)
        if tagged:
            self._publish("partition.run.finished", **{
                **tag, "device": self.name, "queue_wait": start - submitted,
                "run_seconds": end - start, "ok": error is None})
        return outputs, error

    def _idle(self, seconds: float, *, ran: bool) -> None:
        with self._cond:
            self._busy = False
            self._runs += ran
            self._busy_seconds += seconds
            if self._queue or self._closed:  # the worker or close() waits for this
                self._cond.notify_all()

    # events

    def _bus_active(self) -> bool:
        return self._bus is not None and bool(getattr(self._bus, "active", False))

    def publish_memory(self) -> None:
        """A `device.memory` event with the account as it stands (also for a recording
        that starts after the networks were loaded)."""
        if self._bus_active():
            self._publish("device.memory", device=self.name, used_bytes=self._used,
                          total_bytes=self.config.memory_bytes)

    def _publish(self, kind: str, **fields) -> None:
        try:
            self._bus.publish(kind, **fields)
        except Exception:  # a broken subscriber must not stall the device
            log.exception("event %s from %s failed to publish", kind, self.name)
