"""`ray` backend: a device that is one Ray actor process (`ray_actor.PartitionWorker`)
holding an onnxruntime session per loaded partition.

The memory account, its refusals and the events are the Device base's, kept here in the
host; the actor only compiles and runs. Programs go to the actor as their serialized
sub-model (what a bundle stores), and the device keeps them, so a lost actor can be
replaced. A run is one actor call returning one object reference per output; the device
hands those on as `RayTensor`s, so the next `ray` device's call takes them straight from
Ray's object store and only tensors a host-side device or the caller needs come to this
process (`remote.local`). Ray runs an actor's calls from one caller in submission order,
so one collector thread per device waits on the calls' small status returns in order and
answers each run; with nothing to run it pings the actor every `POLL` seconds.

Failure: when the actor dies, every run in flight on it fails (an ExecutionError naming
the device and partition), the device publishes `device.lost`, starts a new actor (Ray
places it on any node with room: the spare), loads every program again and publishes
`device.restored`; runs that arrive meanwhile wait for it. After `MAX_RESTARTS` losses
with no successful run between, the device stays lost and refuses runs at once.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from runtime.devices.backends import register
from runtime.devices.config import DeviceConfig
from runtime.devices.cpu import cpu_ops
from runtime.devices.device import Device, DeviceStats, Program
from runtime.devices.ray import cluster as ray_cluster
from runtime.devices.ray.actor import PartitionWorker, Status
from runtime.devices.remote import RemoteValue
from runtime.errors import (
    DeviceLostError,
    DeviceSpecError,
    ExecutionError,
    ProvisionError,
    first_line,
)
from runtime.types import Outputs, RunDone, Tag

START_TIMEOUT = 30.0  # an actor's process up and answering
LOAD_TIMEOUT = 120.0  # one program compiled in the actor
FETCH_TIMEOUT = 60.0  # one tensor brought to the host
POLL = 0.5  # bound on each collector wait; an idle device pings its actor this often
MAX_RESTARTS = 3  # losses in a row (no successful run between) before the device gives up


class RayTensor(RemoteValue):
    """One output of a run, in Ray's object store."""

    __slots__ = ("_ray", "_value", "device", "ref")

    def __init__(self, ray: Any, ref: Any, device: str,
                 kind: tuple[str, tuple[int, ...]] | None):
        super().__init__(*((np.dtype(kind[0]), tuple(kind[1])) if kind else (None, None)))
        self._ray, self.ref, self.device = ray, ref, device
        self._value: np.ndarray | None = None

    def fetch(self) -> np.ndarray:
        if self._value is None:
            try:
                self._value = self._ray.get(self.ref, timeout=FETCH_TIMEOUT)
            except Exception as exc:
                raise ExecutionError(f"cannot fetch a tensor from {self.device}: "
                                     f"{first_line(exc)}") from None
        return self._value


@dataclass(slots=True, eq=False)
class _Call:
    key: str
    feeds: dict[str, Any]
    tag: Tag | None
    done: RunDone | None  # None: a ping
    arrived: float
    names: list[str] = field(default_factory=list)  # its outputs
    refs: list[Any] = field(default_factory=list)  # the status, then one per output
    generation: int = 0  # which actor it went to


@functools.cache
def _actor_class(ray: Any) -> Any:
    return ray.remote(PartitionWorker)


class RayDevice(Device):
    takes_remote = True

    def __init__(self, config: DeviceConfig, bus: Any = None):
        super().__init__(config, bus)
        self._ray = ray_cluster.acquire()
        self._cond = threading.Condition()
        self._programs: dict[str, Program] = {}  # kept to load again on a new actor
        self._outputs: dict[str, list[str]] = {}
        self._pending: deque[_Call] = deque()  # sent, in order, not yet answered
        self._held: list[_Call] = []  # arrived while the actor was being replaced
        self._recovering = False
        self._gone: str | None = None  # why the device refuses runs for good
        self._closed = False
        self._generation = 0
        self._restarts = 0
        self._runs, self._busy_seconds = 0, 0.0
        self.info: dict[str, Any] = {}
        try:  # the process starts meanwhile; the first load waits for it (`_started`)
            self._actor = self._start_actor()
        except BaseException:
            ray_cluster.release()
            raise
        self._starting: Any = self._actor.info.remote()
        self._collector = threading.Thread(target=self._collect, daemon=True,
                                           name=f"prism-{self.name}-calls")
        self._collector.start()

    @property
    def node(self) -> str:
        """The address of the Ray node the actor runs on."""
        return str(self.info.get("node", ""))

    # -- the actor ---------------------------------------------------------------------

    def _start_actor(self) -> Any:
        resources = dict(self.config.resources)
        options: dict[str, Any] = {"num_cpus": resources.pop("CPU", 0),
                                   "num_gpus": resources.pop("GPU", 0),
                                   "resources": resources, "max_restarts": 0}
        if self.config.node is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                self._node_id(self.config.node), soft=False)
        return _actor_class(self._ray).options(**options).remote(
            self.name, self.config.threads, self.config.timing == "sim", self.config.spin)

    def _await_actor(self, actor: Any, info: Any = None) -> None:
        try:
            self.info = self._ray.get(info or actor.info.remote(), timeout=START_TIMEOUT)
        except Exception as exc:
            self._ray.kill(actor)
            asked = dict(self.config.resources) or "no resources"
            raise ProvisionError(f"device {self.name}: its Ray actor did not start within "
                                 f"{START_TIMEOUT:g} s (asked for {asked}): "
                                 f"{first_line(exc)}") from None

    def _node_id(self, node: str) -> str:
        alive = [n for n in self._ray.nodes() if n.get("Alive")]
        for n in alive:
            if node in (n["NodeManagerAddress"], n["NodeID"]) or n["NodeID"].startswith(node):
                return str(n["NodeID"])
        known = ", ".join(sorted(n["NodeManagerAddress"] for n in alive)) or "none"
        raise DeviceSpecError(f"device {self.name}: no live Ray node {node!r} (nodes: {known})")

    def _load_on(self, actor: Any, key: str, program: Program) -> list[str]:
        try:
            error, names = self._ray.get(
                actor.load.remote(key, program.model, program.est_seconds, program.ops,
                                  dict(program.external), program.half),
                timeout=LOAD_TIMEOUT)
        except Exception as exc:
            raise ProvisionError(f"cannot load {key} on {self.name}: {first_line(exc)}"
                                 ) from None
        if error:
            raise ProvisionError(error)
        return list(names)

    # -- programs ----------------------------------------------------------------------

    def _install(self, key: str, program: Program) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._recovering, LOAD_TIMEOUT)
            refusal = self._refusal()
            actor, starting, self._starting = self._actor, self._starting, None
        if starting is not None and refusal is None:
            self._await_actor(actor, starting)
        if refusal:
            raise ProvisionError(f"cannot load {key}: {refusal}")
        names = self._load_on(actor, key, program)
        with self._cond:  # kept to load on a new actor, the weights its own
            self._programs[key], self._outputs[key] = program.owned(), names

    def _uninstall(self, key: str) -> None:
        with self._cond:
            self._programs.pop(key, None)
            self._outputs.pop(key, None)
            actor = None if self._refusal() or self._recovering else self._actor
        if actor is not None:  # lost meanwhile: its replacement never loads `key`
            with contextlib.suppress(Exception):
                self._ray.get(actor.unload.remote(key), timeout=LOAD_TIMEOUT)

    def held(self) -> list[str]:
        """The keys the actor holds sessions for (asked of the actor itself)."""
        return list(self._ray.get(self._actor.held.remote(), timeout=LOAD_TIMEOUT))

    # -- runs --------------------------------------------------------------------------

    def call(self, key: str, feeds: dict[str, Any], tag: Tag | None, done: RunDone) -> None:
        job = _Call(key, feeds, tag, done, time.perf_counter())
        with self._cond:
            refusal = self._refusal()
            if refusal is None and key not in self._outputs:
                refusal = f"{key} is not loaded on {self.name}"
            if refusal is None:
                if self._recovering:
                    self._held.append(job)
                else:
                    self._send_locked(job)
        if refusal is not None:
            done(None, (DeviceLostError if refusal == self._gone else ExecutionError)(refusal))

    def _refusal(self) -> str | None:
        if self._closed:
            return f"device {self.name} closed"
        return self._gone

    def _send_locked(self, job: _Call) -> None:
        """Under the lock, so calls reach the actor in the order they are pending."""
        job.generation = self._generation
        if job.done is None:
            job.refs = [self._actor.ping.remote()]
        else:
            plain, names, refs = type(job.feeds)(), [], []  # an OutsizedFeeds stays one
            for name, value in job.feeds.items():
                if isinstance(value, RayTensor):
                    names.append(name)
                    refs.append(value.ref)
                else:
                    plain[name] = value
            job.names = self._outputs[job.key]
            job.refs = self._actor.run.options(num_returns=len(job.names) + 1).remote(
                job.key, len(job.names), time.time(), plain, tuple(names), *refs)
            job.feeds = {}  # the tensors travel with the call; do not pin them here
        self._pending.append(job)
        self._cond.notify_all()

    def _collect(self) -> None:
        """Answer the calls in the order they were sent; notice a lost actor."""
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    if (not self._cond.wait(POLL) and not self._pending and not self._closed
                            and not self._recovering and self._gone is None):
                        self._send_locked(_Call("", {}, None, None, time.perf_counter()))
                if not self._pending:
                    return  # closed, and every call answered
                job = self._pending[0]
            try:
                status = self._ray.get(job.refs[0], timeout=POLL)
            except self._ray.exceptions.GetTimeoutError:
                continue
            except Exception as exc:  # the actor died (or was killed by close)
                self._lost(job.generation, exc)
                continue
            with self._cond:
                self._pending.popleft()
                if self._closed and not self._pending:
                    self._cond.notify_all()
            if job.done is not None:
                self._answer(job, status)

    def _answer(self, job: _Call, status: Status) -> None:
        error, seconds, kinds = status
        waited = time.perf_counter() - job.arrived - seconds
        with self._cond:
            self._runs += 1
            self._busy_seconds += seconds
            if error is None:
                self._restarts = 0
        if job.tag is not None and self.publishing:
            self.publish("partition.run.started", **job.tag, device=self.name)
            self.publish("partition.run.finished", **job.tag, device=self.name,
                         queue_wait=waited, run_seconds=seconds, ok=error is None)
        assert job.done is not None
        if error is not None:
            job.done(None, ExecutionError(error))
        else:
            # RayTensors stand in for arrays until the executor's `local`
            job.done(cast(Outputs, {
                n: RayTensor(self._ray, r, self.name, kind)
                for n, r, kind in zip(job.names, job.refs[1:], kinds, strict=True)}), None)

    # -- loss and recovery -------------------------------------------------------------

    def _lost(self, generation: int, exc: BaseException) -> None:
        with self._cond:
            if generation != self._generation:
                return  # that actor's loss was handled already
            failed = [j for j in self._pending if j.done is not None]
            self._pending.clear()
            self._generation += 1
            closed = self._closed
            if not closed:
                self._restarts += 1
                if self._restarts > MAX_RESTARTS:
                    self._gone = (f"device {self.name} is lost: its actor died "
                                  f"{self._restarts} times in a row")
                else:
                    self._recovering = True
            recover = self._recovering
            self._cond.notify_all()
        why = first_line(exc)
        for job in failed:
            assert job.done is not None
            job.done(None, ExecutionError(f"device {self.name} closed before {job.key} "
                                          f"finished") if closed else DeviceLostError(
                f"device {self.name} was lost running {job.key}: {why}"))
        if closed:
            return
        if self.publishing:
            self.publish("device.lost", device=self.name, node=self.node, error=why,
                         in_flight=len(failed), partitions=sorted(self._programs))
        if recover:
            threading.Thread(target=self._recover, args=(time.perf_counter(),), daemon=True,
                             name=f"prism-{self.name}-recover").start()

    def _recover(self, started: float) -> None:
        """A new actor with every program loaded again; then the held runs go to it."""
        try:
            actor = self._start_actor()
            self._await_actor(actor)
            with self._cond:
                programs = dict(self._programs)
            for key, program in programs.items():
                self._load_on(actor, key, program)
        except Exception as exc:
            with self._cond:
                self._gone = f"device {self.name} is lost and could not be replaced: " \
                             f"{first_line(exc)}"
                self._recovering = False
                held, self._held = self._held, []
                self._cond.notify_all()
            for job in held:
                assert job.done is not None
                job.done(None, DeviceLostError(self._gone))
            return
        with self._cond:
            old, self._actor = self._actor, actor
            self._recovering = False
            for job in self._held:
                self._send_locked(job)
            self._held = []
            self._cond.notify_all()
        self._kill(old)
        if self.publishing:
            self.publish("device.restored", device=self.name, node=self.node,
                         seconds=time.perf_counter() - started, partitions=sorted(programs))

    def _kill(self, actor: Any) -> None:
        with contextlib.suppress(Exception):  # gone already
            self._ray.kill(actor)

    # -- stats and closing -------------------------------------------------------------

    def stats(self) -> DeviceStats:
        with self._cond:
            queued = sum(j.done is not None for j in self._pending) + len(self._held)
            health = "lost" if self._gone else "recovering" if self._recovering else "ok"
            return DeviceStats(self.name, self.config.backend, self._runs, self._busy_seconds,
                               max(0, queued - 1), self._used, self.config.memory_bytes,
                               node=self.node, health=health)

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            held, self._held = self._held, []
            self._cond.wait_for(lambda: not self._pending, timeout)
            actor = self._actor
        for job in held:
            assert job.done is not None
            job.done(None, ExecutionError(f"device {self.name} closed"))
        self._kill(actor)  # the collector fails whatever was still running on it
        self._collector.join(timeout)
        ray_cluster.release()


def ray_ops() -> frozenset[str] | None:
    return cpu_ops()


register("ray", RayDevice, ray_ops)
