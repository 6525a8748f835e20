"""The host's slots: at most `max_active` requests run at once, each holding one slot from
start to end; the rest wait in a priority queue (or in their network's batcher).

`Dispatcher` starts requests on their network's least busy replica and is the one place
where a request ends (`finish`): its future answered once, its end reported, its slot
(or its place in line) given back, and whatever that slot lets start, started. One lock
(`cv`) covers the slots, the queue and the host's registry of networks, so admitting a
request costs one lock, and ending it one more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from runtime.batching import Batcher, Finish, split
from runtime.deadlines import Deadlines
from runtime.devices.device import Outputs
from runtime.errors import DeviceLostError, ExecutionError, RequestTimeoutError
from runtime.events import EventBus
from runtime.executor import Executor
from runtime.network import Network
from runtime.requests import ReadyFuture, Request, RequestQueue


class Dispatcher:
    def __init__(self, networks: dict[str, Network | None], bus: EventBus, max_active: int):
        self.networks, self.bus, self.max_active = networks, bus, max_active
        self.cv = threading.Condition()
        self.queue = RequestQueue()
        self.slots_used = 0
        self.closing = False  # the host takes no more requests
        self.stopped = False  # nor starts any: freed slots start nothing more
        self.batchers: tuple[Batcher, ...] = ()  # told of every freed slot
        self.deadlines = Deadlines(self._expire)
        self._uses = 0  # counts replica choices, for least-recently-used
        self._waiters = 0  # threads in wait_for

    # -- slots ---------------------------------------------------------------------------

    def take_locked(self, request: Request, net: Network) -> None:
        """Under the lock: a slot, and the least busy replica."""
        self.slots_used += 1
        request.slot = True
        request.replica = self._least_busy(net)
        net.running.add(request)

    def take_for_batch(self) -> bool:
        """A slot for a batch, if one is free."""
        with self.cv:
            if self.slots_used >= self.max_active or self.stopped:
                return False
            self.slots_used += 1
            return True

    def _least_busy(self, net: Network) -> Executor:
        """Under the lock: fewest outstanding requests, least recently used on ties."""
        replica = min(net.replicas, key=lambda r: (r.outstanding, r.last_used))
        replica.outstanding += 1
        self._uses += 1
        replica.last_used = self._uses
        return replica

    def _free_locked(self, replica: Executor | None) -> list[Request]:
        """Under the lock: one slot given back; the queued requests it lets start."""
        if replica is not None:
            replica.outstanding -= 1
        self.slots_used -= 1
        ready = []
        while self.queue.size and self.slots_used < self.max_active and not self.stopped:
            nxt = self.queue.pop()
            if nxt is not None and not nxt.ended:
                net = self.networks[nxt.network]
                assert net is not None
                self.take_locked(nxt, net)
                ready.append(nxt)
        if self._waiters:
            self.cv.notify_all()
        return ready

    def _after_free(self, ready: list[Request]) -> None:
        if self.bus.active:
            self.bus.publish("queue.depth", depth=self.queue.size, active=self.slots_used)
        for nxt in ready:
            self.begin(nxt)
        for batcher in self.batchers:
            batcher.slot_freed()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Under the lock: wait for `predicate`, at most `timeout` seconds."""
        self._waiters += 1
        try:
            return self.cv.wait_for(predicate, timeout)
        finally:
            self._waiters -= 1

    # -- starting ------------------------------------------------------------------------

    def run_lean(self, net: Network, replica: Executor, feeds: dict[str, np.ndarray]
                 ) -> Future | None:
        """The lean path (a one-partition plan, nobody listening, no timeout): when a slot
        is free, nothing is queued and the device is idle, run on this thread and return a
        finished future; no Request record, no hand-off. None: take the general path."""
        with self.cv:
            if (self.closing or net.removing or self.slots_used >= self.max_active
                    or self.queue.size):
                return None
            self.slots_used += 1
            replica.outstanding += 1
            net.outstanding += 1
        try:
            outputs = replica.run_now(feeds)
            future = None if outputs is None else ReadyFuture(outputs)
        except ExecutionError as exc:
            future = ReadyFuture(exception=exc)
        finally:
            with self.cv:
                net.outstanding -= 1
                ready = self._free_locked(replica)
            self._after_free(ready)
        return future

    def begin(self, request: Request) -> None:
        """Run a request that holds a slot on its replica."""
        if not request.start():
            return  # cancelled or timed out while queued: that path released it
        request.started_at = time.monotonic()
        if self.bus.active:
            self.bus.publish("request.started", network=request.network, request=request.id,
                             queue_wait=request.started_at - request.queued_at, batch_size=1)
        request.replica.start(request, self._landed)

    def _landed(self, request: Request, outputs: Outputs | None,
                error: BaseException | None) -> None:
        """A started request's end, except that one whose device was lost under it runs
        once more on another replica, if its network has one: retried or failed, never
        both."""
        if isinstance(error, DeviceLostError) and not request.retried and not request.ended:
            with self.cv:
                net = self.networks.get(request.network)
                others = [r for r in net.replicas if r is not request.replica] if net else []
                if others:
                    request.retried = True
                    request.replica.outstanding -= 1
                    request.replica = min(others, key=lambda r: (r.outstanding, r.last_used))
                    request.replica.outstanding += 1
            if request.retried:
                if self.bus.active:
                    self.bus.publish("request.retried", network=request.network,
                                     request=request.id, error=str(error),
                                     partition=getattr(error, "partition", None),
                                     device=getattr(error, "device", None))
                request.replica.start(request, self._landed)
                return
        self.finish(request, outputs, error)

    def begin_batch(self, net: Network, batch: Request, done: Finish) -> None:
        """Run a batch (its members started by its batcher) on the least busy replica."""
        with self.cv:
            batch.replica = self._least_busy(net)
            net.running.update(batch.members or ())
        batch.replica.start(batch, done)

    # -- ending --------------------------------------------------------------------------

    def finish(self, request: Request, outputs: Outputs | None, error: BaseException | None
               ) -> None:
        """The one place a request ends: once, with its outputs or an error (a batch: each
        live member with its rows); reported; its slot or place in line given back."""
        if not request.end(outputs, error):
            return
        ended = [request]
        if request.members is not None:
            members = request.members
            parts = split(outputs, members) if outputs is not None else [None] * len(members)
            ended = [m for m, part in zip(members, parts, strict=True) if m.end(part, error)]
        if self.bus.active:
            for r in ended:
                self._report(r, error)
        for r in ended:
            if r.deadline is not None:
                self.deadlines.discard(r)
        with self.cv:
            net = self.networks.get(request.network)
            if net is not None:
                net.running.difference_update(ended)
                net.outstanding -= len(ended)
            freed, request.slot = request.slot, False
            ready = self._free_locked(request.replica) if freed else []
            if not freed:
                self.queue.discard(request)
                if self._waiters:  # remove_network waits for its last request to end
                    self.cv.notify_all()
        if freed:
            self._after_free(ready)
        elif not request.started_at and net is not None and net.batcher is not None:
            net.batcher.discard(request)

    def _expire(self, request: Request) -> None:
        where = "running" if request.started_at else "in the queue"
        self.finish(request, None, RequestTimeoutError(
            f"request {request.id} to {request.network} timed out after "
            f"{time.monotonic() - request.queued_at:.3g} s {where}"))

    def _report(self, request: Request, error: BaseException | None) -> None:
        now = time.monotonic()
        if error is None:
            self.bus.publish("request.finished", network=request.network, request=request.id,
                             latency=now - request.queued_at,
                             queue_wait=request.started_at - request.queued_at,
                             run_seconds=now - request.started_at, batch_size=request.batch_size)
        else:
            self.bus.publish("request.failed", network=request.network, request=request.id,
                             error=str(error), partition=getattr(error, "partition", None),
                             device=getattr(error, "device", None))
