"""The device interface: all the host, the provisioner and the executor use of a device,
and all a backend author writes.

    device.load("net/p0", program)           # account its bytes, then compile; or refuse
    device.call("net/p0", feeds, tag, done)  # the way to run: queue; done(outputs, error) once
    device.run_now("net/p0", feeds)          # optional fast path: run on this thread, or None
    device.unload("net/p0"); device.stats(); device.close()

A device may also keep tensors between runs (`place`, `fetch`, `release`): a program
names graph inputs it reads from them (`Program.resident`) and outputs that replace them
after each run (`Program.writes`), so weights and their optimizer state stay on the device
from one training step to the next. `DeviceManager` keeps them; a device that cannot
refuses such a program.

A backend writes `_install` and `_uninstall` (compile and keep a program, drop it), `call`,
`stats` and `close`. An abstract base class rather than a Protocol: the memory account
(weights add up, activations share one arena as large as the largest) and its refusal
before anything is compiled are the same on every device, and the provisioner's rollback
relies on them, so `load` and `unload` are written once here around the two hooks.
`DeviceManager` (devices/manager.py) compiles in this process and runs on a worker thread
of its own; a device in another process (devices/ray/) ships `Program.model` (bytes) to
its worker in `_install`, answers `call` asynchronously, and calls `done` with an
ExecutionError when the worker is lost.

`run_now` is the one optional fast path, and its contract is the whole of it: run on the
caller's thread when the device is idle (or, given `wait`, once it is free within that
many seconds) and the caller is not a device's own thread; return the outputs, or None
having run nothing; raise an ExecutionError naming the device when the run fails; publish
what `call` publishes for a `tag`; leave the device idle whatever passes through (a
KeyboardInterrupt landing in the run goes on up the caller's thread). The default
declines, and the executor then queues with `call`.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.devices.config import DeviceConfig
from runtime.errors import DeviceMemoryError, ProvisionError
from runtime.types import Outputs, RunDone, Tag

if TYPE_CHECKING:
    import onnx

    from runtime.devices.external import Held

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Program:
    """What a device loads for one partition: its model as serialized ONNX (what crosses a
    process boundary, and what an ahead-of-time bundle stores), the ops it uses (checked
    against the device's op list before anything is compiled), and what it costs.

    `external` holds the files the model names as external data, in memory: a bundle's
    partitions name their weights by offset in its one `weights.bin` (a read-only uint8
    array over the mapped file, shared by every partition), and a model past 2 GB or with
    large weights holds them so too (`external.serialized`). A program from a bundle keeps
    the op types its partition had before optimization (onnxruntime's fused contrib ops
    are not what a device's op list names)."""

    model: bytes
    ops: frozenset[str]
    weight_bytes: int
    activation_bytes: int
    est_seconds: float = 0.0  # one run's modelled time (a `sim` device is held for it)
    name: str = ""  # the model's graph name, for messages
    external: Mapping[str, np.ndarray] = field(default_factory=dict, compare=False)
    resident: tuple[str, ...] = ()  # inputs read from the device's resident tensors
    writes: tuple[tuple[str, str], ...] = ()  # (output, resident tensor it replaces)
    half: bool = False  # the model holds float16 (`graph.holds_half`)

    @classmethod
    def of(cls, model: onnx.ModelProto, weight_bytes: int, activation_bytes: int,
           est_seconds: float = 0.0, held: Held | None = None) -> Program:
        """`held`: the weights already held beside `model` as it was made (`extract`)."""
        from runtime.devices.external import serialized  # onnx: not for a bundle's host
        from runtime.graph import holds_half

        data, files = serialized(model)  # past 2 GB its weights held beside it
        return cls(data, frozenset(n.op_type for n in model.graph.node), int(weight_bytes),
                   int(activation_bytes), est_seconds, model.graph.name,
                   {**files, **(held.files if held is not None else {})},
                   half=holds_half(model))

    def owned(self) -> Program:
        """The program with its own copy of each weight mapped from a model's file (`Held`):
        what is kept to load again later, when the file may have been written since."""
        return replace(self, external={k: np.array(v) if isinstance(v, np.memmap) else v
                                       for k, v in self.external.items()})


@dataclass(frozen=True)
class DeviceStats:
    """A device's own counters, read from the device (metrics.DeviceUsage is the same
    device seen through the event stream)."""

    name: str
    backend: str
    runs: int
    busy_seconds: float
    queue_length: int
    used_bytes: int
    total_bytes: int
    node: str = ""  # where a device in another process runs (a Ray node's address)
    health: str = "ok"  # "recovering" while a lost worker is replaced, "lost" for good


class Device(ABC):
    """One device. Thread-safe: runs, loads and stats may come from any thread."""

    # True if `call` takes and returns `remote.RemoteValue`s (tensors left in another
    # process); the executor fetches them for devices that do not.
    takes_remote = False
    # True if it keeps resident tensors between runs (`place`, Program.resident)
    keeps_resident = False

    def __init__(self, config: DeviceConfig, bus: Any = None):
        self.config, self.name, self.bus = config, config.name, bus
        self._account = threading.Lock()
        self._weights: dict[str, int] = {}  # key -> weight bytes, loaded or loading
        self._arenas: dict[str, int] = {}  # key -> activation bytes
        self._loaded: dict[str, None] = {}  # keys ready to run, in load order
        self._resident: dict[str, np.ndarray] = {}  # tensors kept between runs, by name
        self._used = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, {self.config.backend})"

    # -- memory account ------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def free_bytes(self) -> int:
        return self.config.memory_bytes - self._used

    @property
    def keys(self) -> tuple[str, ...]:
        """What is loaded (not what is still loading)."""
        with self._account:
            return tuple(self._loaded)

    def load(self, key: str, program: Program) -> None:
        """Account `program`'s bytes and compile it under `key`. Refuses before compiling:
        ProvisionError for an op the device does not run or a key in use,
        DeviceMemoryError (bytes needed and free) when it does not fit. A failed compile
        leaves the account as it was."""
        unsupported = sorted(op for op in program.ops if not self.config.can_run(op))
        if unsupported:
            raise ProvisionError(f"{key} uses {', '.join(unsupported)}, which {self.name} "
                                 f"does not support")
        self._check_resident(key, program)
        weights, arena = program.weight_bytes, program.activation_bytes
        if weights < 0 or arena < 0:
            raise ProvisionError(f"{key}: negative byte count for {self.name}")
        with self._account:
            if key in self._weights:
                raise ProvisionError(f"{key} is already loaded on {self.name}")
            before, largest = self._used, max(self._arenas.values(), default=0)
            self._weights[key], self._arenas[key] = weights, arena
            if self._recount() > self.config.memory_bytes:
                del self._weights[key], self._arenas[key]
                self._recount()
                raise DeviceMemoryError.short(key, self.name,
                                              weights + max(0, arena - largest),
                                              self.config.memory_bytes - before,
                                              self.config.memory_bytes)
        try:
            self._install(key, program)
        except BaseException:
            with self._account:
                del self._weights[key], self._arenas[key]
                self._recount()
            raise
        with self._account:
            self._loaded[key] = None
        self.publish_memory()

    def unload(self, key: str) -> int:
        """Forget `key` and free its bytes; returns the bytes freed (0 if not loaded)."""
        with self._account:
            if key not in self._loaded:
                return 0
            del self._loaded[key]
            before = self._used
            del self._weights[key], self._arenas[key]
            freed = before - self._recount()
        self._uninstall(key)
        self.publish_memory()
        return freed

    def _recount(self) -> int:
        """Under the account lock: weights and resident tensors add up; activations share
        one arena as large as the largest, since a device runs one program at a time."""
        self._used = sum(self._weights.values()) + max(self._arenas.values(), default=0) \
            + sum(a.nbytes for a in self._resident.values())
        return self._used

    # -- resident tensors ----------------------------------------------------------------

    def place(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Keep copies of `tensors` on the device, accounted as its memory, for programs to
        read and write (`Program.resident`, `Program.writes`); all or none.
        ProvisionError when the device keeps none or a name is taken, DeviceMemoryError
        when they do not fit."""
        if not self.keeps_resident:
            raise ProvisionError(f"device {self.name} ({self.config.backend}) cannot keep "
                                 f"tensors between runs")
        copies = {name: np.array(value, copy=True) for name, value in tensors.items()}
        with self._account:
            taken = sorted(set(copies) & set(self._resident))
            if taken:
                raise ProvisionError(f"{taken[0]} is already resident on {self.name}")
            before = self._used
            self._resident.update(copies)
            if self._recount() > self.config.memory_bytes:
                for name in copies:
                    del self._resident[name]
                self._recount()
                needed = sum(a.nbytes for a in copies.values())
                raise DeviceMemoryError.short(f"{len(copies)} resident tensors", self.name,
                                              needed, self.config.memory_bytes - before,
                                              self.config.memory_bytes)
        self.publish_memory()

    def fetch(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        """Copies of resident tensors, by name (KeyError naming one not resident)."""
        with self._account:
            missing = [n for n in names if n not in self._resident]
            if missing:
                raise KeyError(f"{missing[0]} is not resident on {self.name}")
            return {n: self._resident[n].copy() for n in names}

    def release(self, names: Iterable[str]) -> int:
        """Forget resident tensors; returns the bytes freed."""
        with self._account:
            before = self._used
            for name in names:
                self._resident.pop(name, None)
            freed = before - self._recount()
        self.publish_memory()
        return freed

    def _check_resident(self, key: str, program: Program) -> None:
        if not (program.resident or program.writes):
            return
        if not self.keeps_resident:
            raise ProvisionError(f"{key} reads resident tensors, which {self.name} "
                                 f"({self.config.backend}) cannot keep")
        with self._account:
            missing = [n for n in (*program.resident, *(r for _, r in program.writes))
                       if n not in self._resident]
        if missing:
            raise ProvisionError(f"{key} reads {missing[0]}, which is not resident on "
                                 f"{self.name}")

    @abstractmethod
    def _install(self, key: str, program: Program) -> None:
        """Compile and keep `program` (its bytes are already accounted); raise
        ProvisionError naming the device when it cannot."""

    @abstractmethod
    def _uninstall(self, key: str) -> None:
        """Drop what `_install` kept."""

    # -- runs ----------------------------------------------------------------------------

    @abstractmethod
    def call(self, key: str, feeds: dict[str, np.ndarray], tag: Tag | None, done: RunDone
             ) -> None:
        """Queue one run. `done(outputs, error)` is called exactly once, on any thread
        (possibly this one, at once, when the device cannot take it), whatever happens to
        the run (a worker that dies answers first): outputs by name, or an ExecutionError
        naming the device. Runs on one device go in arrival order. With a `tag`, the run
        publishes partition.run.started and partition.run.finished. The executor checks
        the outputs against the partition's declared ones, so a device need not."""

    def run_now(self, key: str, feeds: dict[str, np.ndarray], tag: Tag | None = None,
                wait: float = 0.0) -> Outputs | None:
        """The optional fast path (its contract: this module's docstring): the outputs of a
        run on this thread, or None. A thread hand-off costs tens of microseconds, which a
        small model notices. This default declines."""
        return None

    def recent_runs(self, key: str) -> tuple[int, list[float]] | None:
        """How many runs of `key` have succeeded, and the times of the newest (a few
        hundred); None from a device that keeps none (one whose time is modelled keeps
        none: its model is already what it runs)."""
        return None

    @abstractmethod
    def stats(self) -> DeviceStats: ...

    def _stats(self, runs: int, busy_seconds: float, queue_length: int) -> DeviceStats:
        return DeviceStats(self.name, self.config.backend, runs, busy_seconds, queue_length,
                           self._used, self.config.memory_bytes)

    @abstractmethod
    def close(self, timeout: float = 5.0) -> None:
        """Stop taking runs (later calls fail at once), fail queued ones, let the running
        one finish within `timeout`."""

    # -- events --------------------------------------------------------------------------

    @property
    def publishing(self) -> bool:
        return self.bus is not None and bool(getattr(self.bus, "active", False))

    def publish(self, kind: str, /, **fields: Any) -> None:
        try:
            self.bus.publish(kind, **fields)
        except Exception:  # a broken subscriber must not stall the device
            log.exception("event %s from %s failed to publish", kind, self.name)

    def publish_memory(self) -> None:
        """A `device.memory` event with the account as it stands (also for a recording
        that starts after the networks were loaded)."""
        if self.publishing:
            self.publish("device.memory", device=self.name, used_bytes=self._used,
                         total_bytes=self.config.memory_bytes)
