"""HostManager: the public face. Holds the networks, admits requests, closes.

Requests wait in one bounded priority queue (lower number first, FIFO among equals), or
in their network's batcher, until one of `max_active` slots is free; then a replica's
executor runs them. Every accepted request ends exactly once (`Dispatcher.finish`):
outputs, an error, a timeout, a cancellation, or HostClosedError. Every request has a
timeout unless one is turned off by name (math.inf), so a stuck device holds no request,
and no slot, for ever. Loading is the provisioner's (runtime/provision/), admission,
slots and ending the dispatcher's (`dispatch`), the one-partition fast path `lean`'s,
batching `batching`'s, running a request over a plan the executor's (runtime/executor/).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.devices.backends import DeviceFactory, open_device
from runtime.devices.config import DeviceConfig
from runtime.devices.device import Device
from runtime.errors import PrismError
from runtime.executor.futures import ReadyFuture, answer_of
from runtime.executor.requests import DEFAULT_TIMEOUT, Request, checked_timeout
from runtime.host.dispatch import Dispatcher, HostStats
from runtime.host.lean import lean_path
from runtime.host.learning import PlanLearner
from runtime.host.serving import ServedNetwork
from runtime.inputs import InputSpec
from runtime.observe.events import EventBus
from runtime.partition.plan import Plan
from runtime.provision.load import load
from runtime.provision.network import device_pool, unload_network
from runtime.types import BatchingConfig

if TYPE_CHECKING:
    from runtime.bundle.placed import LoadedBundle
    from runtime.graph import Graph
    from runtime.partition.planning import CostsSpec, PartitionSpec
    from runtime.provision.from_model import ModelSource


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
        self._slots = Dispatcher(self.bus, self.max_active)  # the registry, admission, slots
        self._learner = PlanLearner(self._slots, self.bus)  # plans learning while they serve

    # -- networks ----------------------------------------------------------------------

    def add_network(self, name: str, model: ModelSource,
                    partition: PartitionSpec | None = None,
                    annotations: str | Path | Mapping | None = None,
                    fallback: str | None = None, replicas: int | str | None = None,
                    batching: Mapping | BatchingConfig | None = None,
                    bindings: Mapping[str, int] | None = None, timeout: float | None = None,
                    devices: Sequence[str] | None = None, *,
                    remap: Mapping[str, str] | None = None,
                    costs: CostsSpec | None = None,
                    sample_feeds: Mapping[str, Any] | None = None) -> Plan:
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
        `costs`: "measured" (the default, or $PRISM_COSTS: devices that run onnxruntime on
        the CPU get their nodes timed on this machine at the first load, cached after),
        "model" (the roofline), or a CostModel (`live_costs` of a running plan, say).
        `sample_feeds`: one request's feeds (a model whose values matter: ids that must
        hold an end token) that measured costs are timed on, in place of made-up values;
        the symbolic dimensions `bindings` leaves free are bound at their sizes.
        The plan is made against the memory each device has free, and names the devices
        its partitions run on.
        """
        pool = self.devices if devices is None else device_pool(self.devices, devices)
        limit = self.timeout if timeout is None else checked_timeout(timeout, f"timeout of {name}")
        self._slots.reserve(name)
        try:
            loaded = load(name, model, pool, self.bus, partition=partition,
                          annotations=annotations, fallback=fallback, replicas=replicas,
                          batching=BatchingConfig.of(batching), bindings=bindings, remap=remap,
                          costs=costs, sample_feeds=sample_feeds)
        except BaseException:
            self._slots.release(name)
            raise
        try:
            served = ServedNetwork(loaded, limit, self._slots.batcher,
                                   partial(lean_path, slots=self._slots))
        except BaseException:
            unload_network(loaded, self.bus)
            self._slots.release(name)
            raise
        self._slots.register(served)
        self._learner.watch(loaded)
        origin = {} if loaded.bundle is None else {"bundle": loaded.bundle.path,
                                                   "placed": loaded.bundle.devices}
        plan = loaded.plan
        self.bus.publish("network.loaded", network=name, mode=plan.mode,
                         partitions=len(plan.partitions),
                         nodes=sum(len(p.nodes) for p in plan.partitions),
                         devices=sorted({p.device for p in plan.partitions}), **origin)
        return plan

    def remove_network(self, name: str, wait: bool = True, timeout: float = 30.0) -> None:
        """Unload a network. Waits up to `timeout` for its requests, or refuses at once."""
        net = self._slots.retire(name, wait, timeout)
        if net.batcher is not None:
            net.batcher.close()
        unload_network(net.loaded, self.bus)

    def replicas(self, name: str) -> int:
        """How many replicas of the network's plan are loaded."""
        return len(self._slots.network(name).replicas)

    def plan(self, name: str) -> Plan:
        return self._slots.network(name).loaded.plan

    def placements(self, name: str) -> list[dict[str, str]]:
        """Per replica (the plan's own first), partition -> the device that runs it."""
        return [{lp.partition.name: lp.device.name for lp in replica}
                for replica in self._slots.network(name).loaded.loaded]

    def graph(self, name: str) -> Graph:
        """The network's graph (a bundle's is loaded from it on the first call)."""
        return self._slots.network(name).loaded.graph

    def inputs(self, name: str) -> list[InputSpec]:
        """What the network takes as feeds."""
        return self._slots.network(name).specs

    def bundle(self, name: str) -> LoadedBundle | None:
        """The bundle the network was loaded from (its manifest and schedule, on this
        host's devices), or None for one loaded from an ONNX model."""
        return self._slots.network(name).loaded.bundle

    def networks(self) -> list[str]:
        return [net.name for net in self._slots.served()]

    def stats(self) -> HostStats:
        return self._slots.stats()

    # -- requests ----------------------------------------------------------------------

    def run(self, name: str, feeds: Mapping[str, np.ndarray], priority: int = 0,
            timeout: float | None = None, *, inline: bool = True, rows: int = 1,
            waited: bool = False) -> Future:
        """Queue one request; the future resolves to {output name: array}.

        `timeout`: seconds it may take, queued and running, after which it ends with
        RequestTimeoutError; None takes its network's (`add_network(timeout=...)`),
        math.inf turns it off. When a slot is free and nothing waits, the request starts
        at once, and its first partition runs right on this thread if its device is idle
        (no hand-off; an answer past the timeout is then dropped and the request times
        out). `inline=False` never runs anything on this thread: for callers that must not
        block, like load generators and servers. `rows`: the inferences the request counts
        as in its events (a server's model that batches without the host's batcher, which
        counts them itself, as Triton counts them). `waited`: the caller sends nothing
        more until this answer (as `infer`): each later stage too runs on this thread when
        its device is idle, where otherwise it goes to the device's thread so that one
        thread's many requests pipeline.
        """
        net = self._slots.networks.get(name)
        if inline and net is not None and (lean := net.lean_run) is not None:
            ready = lean(feeds, timeout, priority, rows)  # it checks host and network
            if isinstance(ready, ReadyFuture):
                return ready
            checked = ready  # declined: the feeds as it checked (and admitted) them
        else:
            if net is None:
                net = self._slots.admitting(name)  # raises why not (admission is the slots')
            checked = net.check_feeds(feeds)
        timeout = net.timeout if timeout is None else checked_timeout(timeout)
        now = time.monotonic()
        request = Request(name, checked, priority, now + timeout if timeout < math.inf else None,
                          now, rows)  # positional: keywords cost a tenth of making it
        request.waited = waited
        if (batcher := net.batcher) is not None:
            return self._slots.submit_batched(net, batcher, request, self.max_queue)
        return self._slots.submit(net, request, self.max_queue, inline)

    def infer(self, name: str, feeds: Mapping[str, np.ndarray], priority: int = 0,
              timeout: float | None = None) -> dict[str, np.ndarray]:
        """Blocking `run`: every stage whose device is idle runs on this thread."""
        return self.run(name, feeds, priority, timeout, waited=True).result()

    async def run_async(self, name: str, feeds: Mapping[str, np.ndarray], priority: int = 0,
                        timeout: float | None = None) -> dict[str, np.ndarray]:
        """`run` for asyncio: no thread per request, nothing run on the event loop's thread.
        The request's end wakes the loop once; cancelling the awaiting task cancels the
        request if it has not started."""
        return await answer_of(self.run(name, feeds, priority, timeout, inline=False))

    # -- life cycle ----------------------------------------------------------------------

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking requests, let accepted ones finish for up to `timeout`, fail the rest.
        Returns within `timeout` (and a little), even with a device stuck in a run."""
        deadline = time.monotonic() + timeout
        self._learner.close(timeout)
        if not self._slots.stop(max(0.0, deadline - time.monotonic())):
            return  # closed already
        for device in self.devices.values():
            device.close(max(0.0, deadline - time.monotonic()))
        for net in self._slots.clear():
            unload_network(net.loaded, self.bus)

    def __enter__(self) -> HostManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
