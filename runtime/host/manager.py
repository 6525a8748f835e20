"""HostManager: the public face. Holds the networks, admits requests, closes.

Requests wait in one bounded priority queue (lower number first, FIFO among equals), or
in their network's batcher, until one of `max_active` slots is free; then a replica's
executor runs them. Every accepted request ends exactly once (`Dispatcher.finish`):
outputs, an error, a timeout, a cancellation, or HostClosedError. Every request has a
timeout unless one is turned off by name (math.inf), so a stuck device holds no request,
and no slot, for ever. Loading is `network.py`'s job, slots and ending `dispatch.py`'s,
batching `batching.py`'s, running a request over a plan `executor.py`'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from runtime.devices.backends import DeviceFactory, open_device
from runtime.devices.config import DeviceConfig
from runtime.devices.device import Device
from runtime.errors import (
    HostClosedError,
    NetworkExistsError,
    NetworkNotFoundError,
    PrismError,
    QueueFullError,
)
from runtime.executor.futures import answer_of
from runtime.executor.requests import DEFAULT_TIMEOUT, Request, checked_timeout
from runtime.host.batching import BatchingConfig
from runtime.host.dispatch import Dispatcher
from runtime.host.lean import lean_run
from runtime.inputs import InputSpec, check_feeds
from runtime.observe.events import EventBus
from runtime.partition.plan import Plan
from runtime.provision.load import load
from runtime.provision.network import Network, device_pool, unload_network

if TYPE_CHECKING:
    from runtime.graph import Graph
    from runtime.partition.planning import PartitionSpec
    from runtime.provision.from_bundle import LoadedBundle
    from runtime.provision.from_model import ModelSource


@dataclass(frozen=True)
class HostStats:
    slots: int  # max_active: requests that may be in flight at once
    slots_used: int  # slots held, plus lean runs (they hold none, but run or wait to)
    queued: int  # waiting for a slot, in the host's queue or a batcher
    outstanding: dict[str, int]  # network -> requests accepted and not yet ended


class HostManager:
    def __init__(self, devices: Sequence[DeviceConfig | Device], *, max_queue: int = 100,
                 max_active: int | None = None, bus: EventBus | None = None,
                 device_factory: DeviceFactory = open_device,
                 timeout: float = DEFAULT_TIMEOUT):
        """`devices`: DeviceConfigs, each opened by `device_factory(config, bus)` (by
        default the backend's own kind of device), or Device instances; the host owns
        them from here on, and closes them. `timeout`: seconds a request may take, queued
        and running, when neither it nor its network says (default 300); math.inf turns
        it off."""
        names = [d.name for d in devices]
        if not devices or len(set(names)) != len(names):
            raise PrismError(f"HostManager needs at least one device, each named once: {names}")
        self.bus = bus or EventBus()
        opened = [d if isinstance(d, Device) else device_factory(d, self.bus) for d in devices]
        for device in opened:
            if device.bus is None:
                device.bus = self.bus
        self.devices: dict[str, Device] = {d.name: d for d in opened}
        self.max_queue = max_queue
        self.timeout = checked_timeout(timeout, "HostManager timeout")
        self.max_active = max_active or max(2, 2 * len(devices))
        self._networks: dict[str, Network | None] = {}  # None: reserved while it loads
        self._slots = Dispatcher(self._networks, self.bus, self.max_active)
        self._lock = self._slots.lock  # one lock: the registry, admission and the slots

    # -- networks ----------------------------------------------------------------------

    def add_network(self, name: str, model: ModelSource,
                    partition: PartitionSpec | None = None,
                    annotations: str | Path | Mapping | None = None,
                    fallback: str | None = None, replicas: int | str | None = None,
                    batching: Mapping | BatchingConfig | None = None,
                    bindings: Mapping[str, int] | None = None, timeout: float | None = None,
                    devices: Sequence[str] | None = None, *,
                    remap: Mapping[str, str] | None = None) -> Plan:
        """Load, partition, provision. Returns the plan; raises with nothing left loaded.

        `model`: an ONNX model (path, bytes, ModelProto or Graph), or the path of a bundle
        (`NAME.prism`, from `prism compile`), which loads without partitioning: its
        devices are matched to the host's by requirement (`remap`: {bundle device: host
        device} pins one), and its replicas and batching apply unless given here.
        `partition`: a mode (default balanced) or a node -> partition map.
        `replicas`: N whole replicas of the plan, or "saturate" (as many as twin devices
        allow); each request goes to the replica with the fewest outstanding requests.
        `batching`: {"max_batch_size", "max_queue_delay_ms", "preferred_batch_sizes"}.
        `timeout`: seconds a request to this network may take, queued and running, when
        it names none; None takes the host's (`HostManager(timeout=...)`, default 300),
        math.inf turns it off.
        `annotations`: {"nodes": {name: device or kind}, "ops": {op: device or kind},
        "fallback": device} or a TOML file of the same; `fallback` overrides its fallback.
        `devices`: the names of the host's devices it may use (default: all of them).
        """
        pool = self.devices if devices is None else device_pool(self.devices, devices)
        with self._lock:
            if self._slots.closing:
                raise HostClosedError("host is closed")
            if name in self._networks:
                raise NetworkExistsError(f"a network named {name!r} is already added")
            limit = self.timeout if timeout is None else checked_timeout(
                timeout, f"timeout of {name}")
            self._networks[name] = None
        try:
            net = load(name, model, pool, self.bus, partition=partition,
                       annotations=annotations, fallback=fallback, replicas=replicas,
                       batching=BatchingConfig.of(batching), bindings=bindings, remap=remap)
        except BaseException:
            with self._lock:
                del self._networks[name]
            raise
        net.timeout = limit
        if net.batching is not None:
            net.batcher = self._slots.batcher(net)
        net.lean_run = lean_run(net, self._slots)
        with self._lock:
            self._networks[name] = net
            self._slots.batchers_changed()
        origin = {} if net.bundle is None else {"bundle": net.bundle.path,
                                                "placed": net.bundle.devices}
        self.bus.publish("network.loaded", network=name, mode=net.plan.mode,
                         partitions=len(net.plan.partitions),
                         nodes=sum(len(p.nodes) for p in net.plan.partitions),
                         devices=sorted({p.device for p in net.plan.partitions}), **origin)
        return net.plan

    def remove_network(self, name: str, wait: bool = True, timeout: float = 30.0) -> None:
        """Unload a network. Waits up to `timeout` for its requests, or refuses at once."""
        net = self._slots.retire(name, wait, timeout)
        if net.batcher is not None:
            net.batcher.close()
        unload_network(net, self.bus)

    def replicas(self, name: str) -> int:
        """How many replicas of the network's plan are loaded."""
        with self._lock:
            return len(self._slots.network(name).replicas)

    def plan(self, name: str) -> Plan:
        with self._lock:
            return self._slots.network(name).plan

    def graph(self, name: str) -> Graph:
        """The network's graph (a bundle's is loaded from it on the first call)."""
        with self._lock:
            net = self._slots.network(name)
        return net.graph

    def inputs(self, name: str) -> list[InputSpec]:
        """What the network takes as feeds."""
        with self._lock:
            return self._slots.network(name).specs

    def bundle(self, name: str) -> LoadedBundle | None:
        """The bundle the network was loaded from (its manifest and schedule, on this
        host's devices), or None for one loaded from an ONNX model."""
        with self._lock:
            return self._slots.network(name).bundle

    def networks(self) -> list[str]:
        with self._lock:
            return [n for n, net in self._networks.items() if net is not None]

    def stats(self) -> HostStats:
        with self._lock:
            nets = [n for n in self._networks.values() if n is not None]
            batched = sum(len(n.batcher) for n in nets if n.batcher is not None)
            return HostStats(self.max_active,
                             self._slots.slots_used + sum(len(n.lean_runs) for n in nets),
                             self._slots.queue.size + batched,
                             {n.name: n.in_flight for n in nets})

    # -- requests ----------------------------------------------------------------------

    def run(self, name: str, feeds: Mapping[str, np.ndarray], priority: int = 0,
            timeout: float | None = None, *, inline: bool = True) -> Future:
        """Queue one request; the future resolves to {output name: array}.

        `timeout`: seconds it may take, queued and running, after which it ends with
        RequestTimeoutError; None takes its network's (`add_network(timeout=...)`),
        math.inf turns it off. When a slot is free and nothing waits, the request starts
        at once, and its first partition runs right on this thread if its device is idle
        (no hand-off; an answer past the timeout is then dropped and the request times
        out). `inline=False` never runs anything on this thread: for callers that must not
        block, like load generators and servers.
        """
        net = self._networks.get(name)
        if inline and net is not None and (lean := net.lean_run) is not None:
            ready = lean(feeds, timeout, priority)  # it checks the host and the network
            if ready is not None:
                return ready
        if net is None or net.removing or self._slots.closing:
            with self._lock:
                if self._slots.closing:
                    raise HostClosedError("host is closed; it takes no more requests")
                net = self._slots.network(name)
        checked = check_feeds(name, net.specs, feeds)
        timeout = net.timeout if timeout is None else checked_timeout(timeout)
        now = time.monotonic()
        request = Request(name, checked, priority, now + timeout if timeout < math.inf else None,
                          now)  # positional: keywords cost a tenth of making it
        slots, future = self._slots, request.future
        if (batcher := net.batcher) is not None:
            # Into its network's batcher, in this frame (each call is ~2.5 % of a request
            # under 64 threads), taking no lock of the host's: the batcher's own admits it
            # (`Batcher.push`). It is counted by a token in `net.accepted`, put there before
            # the checks, as a lean run is: `retire` either sees it or it sees `removing`;
            # `stop` closes the batchers, failing what they hold, so it is either failed
            # there or refused.
            tokens = net.accepted
            tokens.append(None)
            try:
                if slots.closing:
                    raise HostClosedError("host is closed; it takes no more requests")
                if net.removing:
                    raise NetworkNotFoundError(f"network {name!r} was removed meanwhile")
                future.on_cancel, future.request = slots.on_cancel, request  # `cancellable`
                waiting = batcher.push(request, self.max_queue)
            except BaseException:
                tokens.pop()
                if slots.waiting:  # retire may be waiting for this token
                    with slots.lock:
                        slots.cv.notify_all()
                raise
            if request.deadline is not None:  # after the push: a request refused has none
                slots.deadlines.add(request, request.deadline)
            if self.bus.active:
                self.bus.publish("request.queued", network=name, request=request.id,
                                 priority=priority, queue_depth=waiting)
                self.bus.publish("queue.depth", depth=waiting, active=slots.slots_used)
            return future
        with self._lock:
            waiting = slots.queue.size
            start_now = slots.slots_used < self.max_active and not waiting
            self._admit_locked(net, None if start_now else waiting)
            net.accepted.append(None)
            if request.deadline is not None:
                slots.deadlines.add_locked(request, request.deadline)
            if start_now:
                slots.take_locked(request, net)
                request.inline = inline
            else:
                slots.queue.push(request)
        if self.bus.active:
            self.bus.publish("request.queued", network=name, request=request.id,
                             priority=priority, queue_depth=waiting + (not start_now))
        if start_now:
            slots.begin(request)
            return future
        slots.cancellable(request)
        if self.bus.active:
            self.bus.publish("queue.depth", depth=waiting + 1, active=slots.slots_used)
        return future

    def infer(self, name: str, feeds: Mapping[str, np.ndarray], priority: int = 0,
              timeout: float | None = None) -> dict[str, np.ndarray]:
        """Blocking `run`."""
        return self.run(name, feeds, priority, timeout).result()

    async def run_async(self, name: str, feeds: Mapping[str, np.ndarray], priority: int = 0,
                        timeout: float | None = None) -> dict[str, np.ndarray]:
        """`run` for asyncio: no thread per request, nothing run on the event loop's thread.
        The request's end wakes the loop once; cancelling the awaiting task cancels the
        request if it has not started."""
        return await answer_of(self.run(name, feeds, priority, timeout, inline=False))

    def _admit_locked(self, net: Network, waiting: int | None) -> None:
        """Under the lock, just before a request is accepted: is the host, and `net`, still
        taking requests (both were looked up without the lock), and is there room for one
        more behind `waiting` queued ones (None: it starts at once)?"""
        if self._slots.closing:
            raise HostClosedError("host is closed; it takes no more requests")
        if net.removing or self._networks.get(net.name) is not net:
            raise NetworkNotFoundError(f"network {net.name!r} was removed meanwhile")
        if waiting is not None and waiting >= self.max_queue:
            raise QueueFullError(f"request queue is full ({self.max_queue} waiting); "
                                 f"retry later or raise max_queue")

    # -- life cycle ----------------------------------------------------------------------

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking requests, let accepted ones finish for up to `timeout`, fail the rest.
        Returns within `timeout` (and a little), even with a device stuck in a run."""
        deadline = time.monotonic() + timeout
        if not self._slots.stop(timeout):
            return  # closed already
        for device in self.devices.values():
            device.close(max(0.0, deadline - time.monotonic()))
        for net in list(self._networks.values()):
            if net is not None:
                unload_network(net, self.bus)
        self._networks.clear()

    def __enter__(self) -> HostManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
