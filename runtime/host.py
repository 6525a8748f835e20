"""HostManager: the public face. Adds and removes networks, queues and runs requests.

Requests wait in one bounded priority queue (lower number first, FIFO among equals)
until fewer than `max_active` are in flight; then the executor runs them. Every
accepted request ends exactly once: outputs, an error, a timeout, a cancellation, or
HostClosedError. `remove_network` waits (bounded) for the network's outstanding
requests, or with `wait=False` refuses with NetworkBusyError while any remain.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import onnx

from runtime.batching import (
    Batcher,
    BatchingConfig,
    batch_shape,
    check_batchable,
    concatenate,
    split,
)
from runtime.deadlines import Deadlines
from runtime.devices.config import DeviceConfig
from runtime.devices.manager import DeviceManager
from runtime.errors import (
    ExecutionError,
    HostClosedError,
    InvalidInputError,
    NetworkBusyError,
    NetworkExistsError,
    NetworkNotFoundError,
    PartitionError,
    PrismError,
    QueueFullError,
    RequestTimeoutError,
)
from runtime.events import EventBus
from runtime.executor import Executor
from runtime.graph import Graph, load_graph
from runtime.inputs import InputSpec, check_feeds, input_specs
from runtime.partition import MODES, Plan, partition_steps
from runtime.partition import partition as partition_plan
from runtime.partition.record import finish, tap
from runtime.provision import LoadedPartition, provision, unload
from runtime.replicas import plan_devices, twin_maps
from runtime.requests import ReadyFuture, Request, RequestQueue

ModelSource = str | Path | bytes | onnx.ModelProto


@dataclass(eq=False)
class Network:
    name: str
    graph: Graph
    plan: Plan
    specs: list[InputSpec]
    loaded: list[list[LoadedPartition]]
    copies: list[Executor]
    outstanding: int = 0
    removing: bool = False
    running: set[Request] = field(default_factory=set)
    batcher: Batcher | None = None
    batches: int = 0  # batches in flight
    direct: Executor | None = None  # the copy a request may run through unrecorded (run)

    @property
    def stages(self) -> int:
        """Batches worth having in flight: one per partition of every copy."""
        return sum(max(1, len(copy.parts)) for copy in self.copies)


def _start_future(request: Request) -> bool:
    """Mark a batched request running; False if it was cancelled or has already ended
    (timed out between forming the batch and launching it)."""
    if request.ended:
        return False
    try:
        return request.future.set_running_or_notify_cancel()
    except RuntimeError:  # finished meanwhile
        return False


def _mode(partition: str | Path | Mapping) -> tuple[str, str | Path | Mapping | None]:
    if isinstance(partition, Mapping) or (
            not isinstance(partition, str) or partition not in MODES):
        return "user", partition
    return partition, None


class HostManager:
    def __init__(self, devices: Sequence[DeviceConfig], *, max_queue: int = 100,
                 max_active: int | None = None, bus: EventBus | None = None):
        if not devices:
            raise PrismError("HostManager needs at least one device")
        self.bus = bus or EventBus()
        self.devices = {d.name: DeviceManager(d, self.bus) for d in devices}
        if len(self.devices) != len(devices):
            raise PrismError(f"device names repeat: {[d.name for d in devices]}")
        self.max_queue = max_queue
        self.max_active = max_active or max(2, 2 * len(devices))
        self._networks: dict[str, Network | None] = {}
        self._queue = RequestQueue()
        self._active = 0
        self._closed = False
        self._uses = 0  # counts copy choices, for least-recently-used
        self._waiters = 0  # threads in close() or remove_network() waiting on _cv
        self._cv = threading.Condition()
        self._deadlines = Deadlines(self._expire)
        self._batchers: tuple[Batcher, ...] = ()  # of the loaded networks, told of free places

    # -- networks ----------------------------------------------------------------------

    def add_network(self, name: str, model: ModelSource, partition: str | Path | Mapping =
                    "balanced", annotations: str | Path | Mapping | None = None,
                    fallback: str | None = None,
                    replicas: int | str = 1, batching: Mapping | None = None,
                    bindings: Mapping[str, int] | None = None) -> Plan:
        """Load, partition, provision. Returns the plan; raises with nothing left loaded.

        `replicas`: N whole copies of the plan, or "saturate" (as many as twin devices
        allow); each request goes to the copy with the fewest outstanding requests.
        `batching`: {"max_batch_size", "max_queue_delay_ms", "preferred_batch_sizes"}.

        `annotations`: {"nodes": {name: device or kind}, "ops": {op: device or kind},
        "fallback": device} or a TOML file of the same; `fallback` overrides its fallback.
        """
        with self._cv:
            if self._closed:
                raise HostClosedError("host is closed")
            if name in self._networks:
                raise NetworkExistsError(f"a network named {name!r} is already added")
            self._networks[name] = None  # reserved while it loads
        try:
            net = self._load(name, model, partition, bindings, annotations, fallback, replicas,
                             BatchingConfig.of(batching))
        except BaseException:
            with self._cv:
                del self._networks[name]
            raise
        with self._cv:
            self._networks[name] = net
            self._batchers = self._batchers_locked()
        self._publish("network.loaded", network=name, mode=net.plan.mode,
                      partitions=len(net.plan.partitions),
                      devices=sorted({p.device for p in net.plan.partitions}),
                      nodes=len(net.graph.nodes))
        return net.plan

    def _load(self, name: str, model: ModelSource, partition: str | Path | Mapping,
              bindings: Mapping[str, int] | None, annotations: str | Path | Mapping | None,
              fallback: str | None, replicas: int | str, batching: BatchingConfig | None
              ) -> Network:
        graph = load_graph(model, bindings=bindings, name=name)
        if batching is not None:
            check_batchable(graph)
        mode, user_map = _mode(partition)
        options = {"user_map": user_map, "annotations": annotations, "fallback": fallback}
        devices = [m.config for m in self.devices.values()]
        if replicas != 1:
            def fits(some: list[DeviceConfig]) -> bool:
                try:
                    return bool(partition_plan(graph, some, mode, **options))
                except PartitionError:
                    return False
            devices = plan_devices(devices, replicas, fits)
        plan = finish(tap(partition_steps(graph, devices, mode, **options),
                          lambda step: self._publish(
                              "partition.step", network=name, index=step.index, step=step.kind,
                              reason=step.reason, partition=step.partition,
                              device=step.device, nodes=list(step.nodes))))
        self._publish("partition.planned", network=name, mode=plan.mode,
                      bottleneck_seconds=plan.bottleneck_seconds,
                      partitions=[{"name": p.name, "device": p.device, "nodes": len(p.nodes),
                                   "est_seconds": p.est_seconds} for p in plan.partitions])
        maps = [] if replicas == 1 else twin_maps(
            plan, [m.config for m in self.devices.values()],
            None if replicas == "saturate" else int(replicas) - 1)
        loaded = [provision(graph, plan, self.devices, network=name, bus=self.bus)]
        try:
            for r, place in enumerate(maps, 1):
                loaded.append(provision(graph, plan, self.devices, network=name, tag=f"#{r}",
                                        bus=self.bus, place=place))
        except BaseException:
            for copy in loaded:
                unload(copy, network=name, bus=self.bus)
            raise
        net = Network(name, graph, plan, input_specs(graph), loaded,
                      [Executor(graph, copy, name, self.bus) for copy in loaded])
        if batching is not None:
            net.batcher = Batcher(name, batching, partial(self._take_place_for_batch, net),
                                  partial(self._batch_place_back, net),
                                  partial(self._launch_batch, net),
                                  partial(self._batch_failed, net))
        elif len(net.copies) == 1 and net.copies[0].single:
            net.direct = net.copies[0]
        return net

    def remove_network(self, name: str, wait: bool = True, timeout: float = 30.0) -> None:
        """Unload a network. Waits up to `timeout` for its requests, or refuses at once."""
        with self._cv:
            net = self._network(name)
            if net.outstanding and not wait:
                raise NetworkBusyError(f"{name} has {net.outstanding} requests outstanding; "
                                       f"remove_network(wait=True) waits for them")
            net.removing = True
            if not self._wait_for(lambda: net.outstanding == 0, timeout):
                net.removing = False
                raise NetworkBusyError(f"{name} still has {net.outstanding} requests after "
                                       f"{timeout:g} s; not removed")
            del self._networks[name]
            self._batchers = self._batchers_locked()
        if net.batcher is not None:
            net.batcher.close()
        for loaded in net.loaded:
            unload(loaded, network=name, bus=self.bus)

    def _batchers_locked(self) -> tuple[Batcher, ...]:
        return tuple(net.batcher for net in self._networks.values()
                     if net is not None and net.batcher is not None)

    def copies(self, name: str) -> int:
        """How many copies of the network's plan are loaded (replicas)."""
        with self._cv:
            return len(self._network(name).copies)

    def plan(self, name: str) -> Plan:
        with self._cv:
            return self._network(name).plan

    def graph(self, name: str) -> Graph:
        with self._cv:
            return self._network(name).graph

    def networks(self) -> list[str]:
        with self._cv:
            return [n for n, net in self._networks.items() if net is not None]

    def _network(self, name: str) -> Network:
        net = self._networks.get(name)
        if net is None or net.removing:
            state = "is being removed" if net else "is not loaded"
            known = ", ".join(n for n, v in self._networks.items() if v) or "none"
            raise NetworkNotFoundError(f"network {name!r} {state} (loaded: {known})")
        return net

    # -- requests ----------------------------------------------------------------------

    def run(self, name: str, feeds: Mapping[str, np.ndarray], priority: int = 0,
            timeout: float | None = None, *, inline: bool = True) -> Future:
        """Queue one request; the future resolves to {output name: array}.

        When a place is free and nothing waits, the request starts at once, and its first
        partition runs right on this thread if its device is idle (no hand-off).
        `inline=False` never runs anything on this thread: for callers that must not
        block, like load generators and servers.
        """
        net = self._networks.get(name)
        if net is None or net.removing or self._closed:
            with self._cv:
                if self._closed:
                    raise HostClosedError("host is closed; it takes no more requests")
                net = self._network(name)
        feeds = check_feeds(name, net.specs, feeds)
        if inline and timeout is None and not self.bus.active and net.direct is not None:
            future = self._run_direct(net, net.direct, feeds)
            if future is not None:
                return future
        request = Request(name, feeds, priority, queued_at=time.monotonic())
        if timeout is not None:
            request.deadline = request.queued_at + timeout
        if net.batcher is not None:
            return self._to_batcher(net, request)
        with self._cv:
            waiting = self._queue.size
            start_now = self._active < self.max_active and not waiting
            self._admit_locked(net, None if start_now else waiting)
            net.outstanding += 1
            if start_now:
                self._take_place(request, net)
                request.inline = inline
            else:
                self._queue.push(request)
            depth = waiting + (not start_now)
        if self.bus.active:
            self.bus.publish("request.queued", network=name, request=request.id,
                             priority=priority, queue_depth=depth)
        if request.deadline is not None:
            self._deadlines.add(request)
        if start_now:
            self._begin(request, net)
            return request.future
        request.future.on_cancel = partial(self._cancelled, request)
        if self.bus.active:
            self.bus.publish("queue.depth", depth=depth, active=self._active)
        return request.future

    def _admit_locked(self, net: Network, waiting: int | None) -> None:
        """Under the lock, just before a request is accepted: is the host, and `net`, still
        taking requests (both were looked up without the lock), and is there room for one
        more behind `waiting` queued ones (None: it starts at once)?"""
        if self._closed:
            raise HostClosedError("host is closed; it takes no more requests")
        if net.removing or self._networks.get(net.name) is not net:
            raise NetworkNotFoundError(f"network {net.name!r} was removed meanwhile")
        if waiting is not None and waiting >= self.max_queue:
            raise QueueFullError(f"request queue is full ({self.max_queue} waiting); "
                                 f"retry later or raise max_queue")

    def _to_batcher(self, net: Network, request: Request) -> Future:
        """`run` for a network that batches: the request waits in its batcher's queue."""
        batcher = net.batcher
        request.rows, request.key = batch_shape(request.feeds)
        if request.rows > batcher.config.max_batch_size:
            raise InvalidInputError(
                f"request to {net.name} has batch {request.rows}, more than its "
                f"max_batch_size {batcher.config.max_batch_size}")
        with self._cv:
            depth = len(batcher)
            self._admit_locked(net, depth)
            net.outstanding += 1
        if self.bus.active:
            self.bus.publish("request.queued", network=net.name, request=request.id,
                             priority=request.priority, queue_depth=depth + 1)
        if request.deadline is not None:
            self._deadlines.add(request)
        request.future.on_cancel = partial(self._cancelled, request)
        batcher.push(request)
        if self.bus.active:
            self.bus.publish("queue.depth", depth=depth + 1, active=self._active)
        return request.future

    def _run_direct(self, net: Network, copy: Executor, feeds: dict[str, np.ndarray]
                    ) -> Future | None:
        """The lean path (a one-partition plan, nobody listening, no timeout): when a place
        is free, nothing is queued and the device is idle, run on this thread and return a
        finished future; no Request record, no hand-off. None: take the general path."""
        with self._cv:
            if (self._closed or net.removing or self._active >= self.max_active
                    or self._queue.size):
                return None
            self._active += 1
            copy.outstanding += 1
            net.outstanding += 1
        try:
            outputs = copy.run_direct(feeds)
            future = None if outputs is None else ReadyFuture(outputs)
        except ExecutionError as exc:
            future = ReadyFuture(exception=exc)
        finally:
            with self._cv:
                net.outstanding -= 1
                ready = self._free_place_locked(copy)
            self._after_release(ready)
        return future

    def infer(self, name: str, feeds: Mapping[str, np.ndarray], priority: int = 0,
              timeout: float | None = None) -> dict[str, np.ndarray]:
        """Blocking `run`."""
        return self.run(name, feeds, priority, timeout).result()

    def _take_place(self, request: Request, net: Network) -> None:
        """Under the lock: one of max_active places, and the least busy plan copy."""
        self._active += 1
        request.slot = True
        request.copy = self._least_busy(net)
        net.running.add(request)

    def _least_busy(self, net: Network) -> Executor:
        """Under the lock: the copy with the fewest outstanding, least recently used on ties."""
        copy = min(net.copies, key=lambda c: (c.outstanding, c.last_used))
        copy.outstanding += 1
        self._uses += 1
        copy.last_used = self._uses
        return copy

    def _begin(self, request: Request, net: Network) -> None:
        if not _start_future(request):
            return  # cancelled or timed out while queued: that path released it
        request.started_at = time.monotonic()
        if self.bus.active:
            self.bus.publish("request.started", network=net.name, request=request.id,
                             queue_wait=request.started_at - request.queued_at,
                             batch_size=request.batch_size)
        request.copy.start(request, self._finished)

    def _finished(self, request: Request, outputs: dict | None, error: BaseException | None
                  ) -> None:
        if request.end(outputs, error):
            self._report(request, error)
            self._release(request)

    def _expire(self, request: Request) -> None:
        where = "running" if request.started_at else "in the queue"
        waited = time.monotonic() - request.queued_at
        error = RequestTimeoutError(f"request {request.id} to {request.network} timed out "
                                    f"after {waited:.3g} s {where}")
        if request.end(error=error):
            self._report(request, error)
            self._release(request)

    def _cancelled(self, request: Request) -> None:
        if request.end():
            self._report(request, "cancelled")
            self._release(request)

    def _report(self, request: Request, error: BaseException | str | None) -> None:
        if not self.bus.active:
            return
        now = time.monotonic()
        if error is None:
            self._publish("request.finished", network=request.network, request=request.id,
                          latency=now - request.queued_at,
                          queue_wait=request.started_at - request.queued_at,
                          run_seconds=now - request.started_at, batch_size=request.batch_size)
        else:
            self._publish("request.failed", network=request.network, request=request.id,
                          error=str(error), partition=getattr(error, "partition", None),
                          device=getattr(error, "device", None))

    def _release(self, request: Request) -> None:
        """Give back an ended request's place; start whatever the queue lets start."""
        if request.deadline is not None:
            self._deadlines.discard(request)
        with self._cv:
            net = self._networks.get(request.network)
            if net is not None:
                net.running.discard(request)
                net.outstanding -= 1
            freed = request.slot
            if freed:
                request.slot = False
                ready = self._free_place_locked(request.copy)
            else:
                self._queue.discard(request)
        if net is not None and net.batcher is not None and not request.started_at:
            net.batcher.discard(request)
        if freed:  # a queued or batched request only gave back its own waiting
            self._after_release(ready)

    def _free_place_locked(self, copy: Executor | None) -> list[tuple[Request, Network]]:
        """Under the lock: one place given back; the queued requests it lets start."""
        if copy is not None:
            copy.outstanding -= 1
        self._active -= 1
        ready: list[tuple[Request, Network]] = []
        while self._queue.size and self._active < self.max_active and not self._closed_hard:
            nxt = self._queue.pop()
            if nxt is None or nxt.ended:
                continue
            nxt_net = self._networks[nxt.network]
            self._take_place(nxt, nxt_net)
            ready.append((nxt, nxt_net))
        if self._waiters:
            self._cv.notify_all()
        return ready

    def _after_release(self, ready: list[tuple[Request, Network]]) -> None:
        if self.bus.active:
            self.bus.publish("queue.depth", depth=self._queue.size, active=self._active)
        for nxt, nxt_net in ready:
            self._begin(nxt, nxt_net)
        for batcher in self._batchers:
            batcher.place_freed()

    def _free_place(self, copy: Executor | None = None) -> None:
        with self._cv:
            ready = self._free_place_locked(copy)
        self._after_release(ready)

    # -- batches ---------------------------------------------------------------------

    def _take_place_for_batch(self, net: Network) -> bool:
        """A place for a batch, if one is free and the network has a stage idle: like
        Triton, keep gathering while every instance is busy rather than queue a batch."""
        with self._cv:
            if (self._active >= self.max_active or self._closed_hard
                    or net.batches >= 2 * net.stages):
                return False
            self._active += 1
            net.batches += 1
            return True

    def _batch_place_back(self, net: Network, copy: Executor | None = None) -> None:
        with self._cv:
            net.batches -= 1
            ready = self._free_place_locked(copy)
        self._after_release(ready)

    def _launch_batch(self, net: Network, members: list[Request]) -> None:
        """Run waiting requests as one: concatenate, run once, split (batcher's thread)."""
        live = [m for m in members if _start_future(m)]
        if not live:
            self._batch_place_back(net)
            return
        now, size = time.monotonic(), len(live)
        for m in live:  # started from here on: a deadline now finds it running
            m.started_at = now
            m.batch_size = size
        if self.bus.active:
            for m in live:
                self.bus.publish("request.started", network=net.name, request=m.id,
                                 queue_wait=now - m.queued_at, batch_size=size)
        batch = Request(net.name, concatenate(live), batch_size=len(live), slot=True,
                        queued_at=min(m.queued_at for m in live), rows=sum(m.rows for m in live))
        with self._cv:
            batch.copy = self._least_busy(net)
            net.running.update(live)
        batch.started_at = now
        batch.copy.start(batch, lambda *ended: net.batcher.post(
            partial(self._batch_finished, net, live, *ended)))

    def _batch_failed(self, net: Network, members: list[Request], error: BaseException
                      ) -> None:
        """A batch that could not even start: its requests fail, its place comes back."""
        for member in members:
            if member.end(error=error):
                self._report(member, error)
                self._release(member)
        self._batch_place_back(net)

    def _batch_finished(self, net: Network, members: list[Request], batch: Request,
                        outputs: dict | None, error: BaseException | None) -> None:
        if batch.end(outputs, error):
            parts = split(outputs, members) if error is None else [None] * len(members)
            ended = []
            for member, part in zip(members, parts, strict=True):
                if member.end(part, error):
                    ended.append(member)
                    if member.deadline is not None:
                        self._deadlines.discard(member)
            with self._cv:  # one lock for the whole batch's bookkeeping
                net.running.difference_update(ended)
                net.outstanding -= len(ended)
                net.batches -= 1
                ready = self._free_place_locked(batch.copy)
            if self.bus.active:
                for member in ended:
                    self._report(member, error)
            self._after_release(ready)

    _closed_hard = False

    # -- life cycle ----------------------------------------------------------------------

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking requests, let accepted ones finish for up to `timeout`, fail the rest."""
        with self._cv:
            if self._closed_hard:
                return
            self._closed = True
            self._wait_for(lambda: self._active == 0 and not self._queue.size and not any(
                net.batcher for net in self._networks.values()
                if net is not None and net.batcher is not None), timeout)
            self._closed_hard = True
            leftovers = self._queue.drain()
            batchers = []
            for net in self._networks.values():
                if net is not None:
                    leftovers.extend(net.running)
                    if net.batcher is not None:
                        batchers.append(net.batcher)
        for batcher in batchers:
            leftovers.extend(batcher.close())
        for request in leftovers:
            error = HostClosedError(f"host closed before request {request.id} to "
                                    f"{request.network} finished")
            if request.end(error=error):
                self._report(request, error)
        self._deadlines.close()
        for manager in self.devices.values():
            manager.close()
        for name, net in list(self._networks.items()):
            if net is not None:
                for loaded in net.loaded:
                    unload(loaded, network=name, bus=self.bus)
        self._networks.clear()

    def _wait_for(self, predicate, timeout: float) -> bool:
        """Under the lock: wait for `predicate`, at most `timeout` seconds."""
        self._waiters += 1
        try:
            return self._cv.wait_for(predicate, timeout)
        finally:
            self._waiters -= 1

    def __enter__(self) -> HostManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _publish(self, kind: str, /, **fields) -> None:
        if self.bus.active:
            self.bus.publish(kind, **fields)
