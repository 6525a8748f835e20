"""The host's slots: at most `max_active` requests run at once, each holding one slot from
start to end; the rest wait in a priority queue (or in their network's batcher).

`Dispatcher` holds the registry of networks being served, admits requests (`refused`:
the one admission check, on every path, the lean one included), starts them on their
network's least busy replica, and is the one place where a request ends (`finish`): its
future answered once, its end reported, its slot (or its place in line) given back, and
whatever that slot lets start, started. One lock covers the slots, the queue, the
deadlines and the registry, so admitting a request costs one lock, and ending it one
more. `stop` and `retire` wait on it for requests to end; whatever ends one calls `wake`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass

from runtime.errors import (
    DeviceLostError,
    ExecutionError,
    HostClosedError,
    NetworkBusyError,
    NetworkExistsError,
    NetworkNotFoundError,
    PrismError,
    QueueFullError,
    RequestTimeoutError,
    described,
)
from runtime.executor.executor import Executor
from runtime.executor.futures import RequestFuture
from runtime.executor.requests import Request, RequestDone, RequestQueue
from runtime.host.batching import Batcher, alike_but_first, split
from runtime.host.deadlines import Deadlines
from runtime.host.serving import ServedNetwork
from runtime.observe.events import EventBus
from runtime.provision.network import LoadedNetwork
from runtime.types import Outputs


@dataclass(frozen=True)
class HostStats:
    slots: int  # max_active: requests that may be in flight at once
    slots_used: int  # slots held, plus lean runs (they hold none, but run or wait to)
    queued: int  # waiting for a slot, in the host's queue or a batcher
    outstanding: dict[str, int]  # network -> requests accepted and not yet ended


CANCELLED = CancelledError("cancelled")
CLOSED = "host is closed; it takes no more requests"
LOOK_AGAIN = 0.005  # seconds between looks of a waiting `stop` or `retire` (lean runs end unseen)


class Dispatcher:
    def __init__(self, bus: EventBus, max_active: int):
        self.networks: dict[str, ServedNetwork | None] = {}  # None: reserved while it loads
        self.bus, self.max_active = bus, max_active
        lock = self.lock = threading.RLock()  # taken bare on hot paths: a Condition's
        self.cv = threading.Condition(lock)    # `with` is a Python call, the RLock's is not
        self.queue = RequestQueue()
        self.slots_used = 0
        self.closing = False  # the host takes no more requests
        self.stopped = False  # nor starts any: freed slots start nothing more
        self.batchers: tuple[Batcher, ...] = ()  # told of every freed slot
        self.deadlines = Deadlines(self._expire, lock)
        self._uses = 0  # counts replica choices, for least-recently-used
        self.waiting = 0  # threads in wait_for
        self.on_cancel = self._cancelled  # bound once

    def batcher(self, net: LoadedNetwork) -> Batcher:
        """A batcher for `net`, lent this dispatcher's slots, replicas and ending."""
        assert net.batching is not None
        return Batcher(net.name, net.batching, 2 * net.stages, take_slot=self.take_for_batch,
                       begin=self.begin_batch, finish=self.finish, bus=self.bus,
                       uniform=alike_but_first(net.specs))

    # -- admission -----------------------------------------------------------------------

    def refused(self, net: ServedNetwork, waiting: int | None = None, limit: float = math.inf
                ) -> PrismError | None:
        """Why `net` takes no request now, or None: the one admission check, on every path.
        The host closing, `net` being removed, or (`waiting` given: it would queue behind
        that many) the queue at `limit`. Read without the lock by the lean and batched
        paths, whose tokens make the read safe (`stop` and `retire` set their flag, then
        wait for the tokens to go)."""
        if self.closing:
            return HostClosedError(CLOSED)
        if net.removing:
            return NetworkNotFoundError(f"network {net.name!r} is being removed")
        if waiting is not None and waiting >= limit:
            return QueueFullError.at(int(limit))
        return None

    def wake(self) -> None:
        """Wake `stop` or `retire` if they wait (`wait_for`), for a request to end."""
        if self.waiting:
            with self.lock:
                self.cv.notify_all()

    def submit(self, net: ServedNetwork, request: Request, limit: int, inline: bool
               ) -> Future:
        """Admit `request` to a slot, started now (its first stage on this thread when
        `inline` and its device is idle) if one is free and nothing waits, else queued
        behind at most `limit` others."""
        with self.lock:
            waiting = self.queue.size
            start_now = self.slots_used < self.max_active and not waiting
            if (refusal := self.refused(net, None if start_now else waiting, limit)) is not None:
                raise refusal
            net.accepted.append(None)
            if request.deadline is not None:
                self.deadlines.add_locked(request, request.deadline)
            if start_now:
                self.take_locked(request, net)
                request.inline = inline
            else:
                self.queue.push(request)
        if self.bus.active:
            self.bus.publish("request.queued", network=net.name, request=request.id,
                             priority=request.priority, queue_depth=waiting + (not start_now))
        if start_now:
            self.begin(request)
            return request.future
        self.cancellable(request)
        if self.bus.active:
            self.bus.publish("queue.depth", depth=waiting + 1, active=self.slots_used)
        return request.future

    def submit_batched(self, net: ServedNetwork, batcher: Batcher, request: Request,
                       limit: int) -> Future:
        """Admit `request` to its network's batcher, taking no lock of the host's (the
        batcher's own admits it, `Batcher.push`). It is counted by a token in
        `net.accepted`, put there before the check, as a lean run's is: `retire` either sees
        it or it sees `removing`; `stop` closes the batchers, failing what they hold, so it
        is either failed there or refused."""
        tokens = net.accepted
        tokens.append(None)
        try:
            if (refusal := self.refused(net)) is not None:
                raise refusal
            self.cancellable(request)
            waiting = batcher.push(request, limit)
        except BaseException:
            tokens.pop()
            self.wake()  # retire may be waiting for this token
            raise
        if request.deadline is not None:  # after the push: a request refused has none
            self.deadlines.add(request, request.deadline)
        if self.bus.active:
            self.bus.publish("request.queued", network=net.name, request=request.id,
                             priority=request.priority, queue_depth=waiting)
            self.bus.publish("queue.depth", depth=waiting, active=self.slots_used)
        return request.future

    def stop(self, timeout: float) -> bool:
        """Take no more requests, let accepted ones finish for up to `timeout`, fail the
        rest, stop the batchers and the deadline timer. False if stopped already."""
        deadline = time.monotonic() + timeout
        with self.lock:
            if self.stopped:
                return False
            self.closing = True
            self.wait_for(lambda: not self.slots_used and not self.queue.size and not any(
                len(b) for b in self.batchers) and not any(
                n.lean_runs for n in self.networks.values() if n), timeout)
            self.stopped = True
            leftovers = self.queue.drain()
            for net in self.networks.values():
                leftovers.extend(net.running if net else ())
        for batcher in self.batchers:
            leftovers.extend(batcher.close(max(0.0, deadline - time.monotonic())))
        for request in leftovers:
            self.finish(request, None, HostClosedError(
                f"host closed before request {request.id} to {request.network} finished"))
        self.deadlines.close(max(0.0, deadline - time.monotonic()))
        return True

    # -- the registry --------------------------------------------------------------------

    def network(self, name: str) -> ServedNetwork:
        """A network being served, by name, or NetworkNotFoundError naming those loaded."""
        with self.lock:
            net = self.networks.get(name)
            if net is None or net.removing:
                state = "is being removed" if net else "is not loaded"
                known = ", ".join(n for n, v in self.networks.items() if v) or "none"
                raise NetworkNotFoundError(f"network {name!r} {state} (loaded: {known})")
            return net

    def admitting(self, name: str) -> ServedNetwork:
        """The network a request to `name` goes to, or why there is none: the host closed,
        or no such network (admission itself is `refused`, where the request is taken)."""
        if self.closing:
            raise HostClosedError(CLOSED)
        return self.network(name)

    def stats(self) -> HostStats:
        with self.lock:
            nets = [n for n in self.networks.values() if n is not None]
            batched = sum(len(n.batcher) for n in nets if n.batcher is not None)
            return HostStats(self.max_active,
                             self.slots_used + sum(len(n.lean_runs) for n in nets),
                             self.queue.size + batched, {n.name: n.in_flight for n in nets})

    def clear(self) -> list[ServedNetwork]:
        """Once stopped: every network, taken out of the registry (for unloading)."""
        with self.lock:
            nets = [n for n in self.networks.values() if n is not None]
            self.networks.clear()
            return nets

    def served(self) -> list[ServedNetwork]:
        with self.lock:
            return [n for n in self.networks.values() if n is not None]

    def reserve(self, name: str) -> None:
        """Hold `name` while its network loads: a second add of it is refused at once."""
        with self.lock:
            if self.closing:
                raise HostClosedError("host is closed")
            if name in self.networks:
                raise NetworkExistsError(f"a network named {name!r} is already added")
            self.networks[name] = None

    def release(self, name: str) -> None:
        """Give up a reserved name (its load failed)."""
        with self.lock:
            del self.networks[name]

    def register(self, net: ServedNetwork) -> None:
        """Serve `net` under the name reserved for it."""
        with self.lock:
            self.networks[net.name] = net
            self._batchers_changed()

    def _batchers_changed(self) -> None:
        """Under the lock: the batchers to tell of freed slots, after a network came or went."""
        self.batchers = tuple(n.batcher for n in self.networks.values()
                              if n and n.batcher is not None)

    def retire(self, name: str, wait: bool, timeout: float) -> ServedNetwork:
        """Take a network out of the registry once its requests have ended (up to
        `timeout`), or refuse (NetworkBusyError) and leave it serving."""
        with self.lock:
            net = self.network(name)
            if net.in_flight and not wait:
                raise NetworkBusyError(f"{name} has {net.in_flight} requests outstanding; "
                                       f"remove_network(wait=True) waits for them")
            net.removing = True
            if not self.wait_for(lambda: net.in_flight == 0, timeout):
                net.removing = False
                raise NetworkBusyError(f"{name} still has {net.in_flight} requests after "
                                       f"{timeout:g} s; not removed")
            del self.networks[name]
            self._batchers_changed()
        return net

    # -- slots ---------------------------------------------------------------------------

    def take_locked(self, request: Request, net: ServedNetwork) -> None:
        """Under the lock: a slot, and the least busy replica."""
        self.slots_used += 1
        request.slot = True
        request.replica = self._least_busy(net)
        net.running.add(request)

    def take_for_batch(self) -> bool:
        """A slot for a batch, if one is free."""
        with self.lock:
            if self.slots_used >= self.max_active or self.stopped:
                return False
            self.slots_used += 1
            return True

    def _least_busy(self, net: ServedNetwork) -> Executor:
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
        now = time.monotonic()
        while self.queue.size and self.slots_used < self.max_active and not self.stopped:
            nxt = self.queue.pop()
            if nxt is not None and not nxt.ended:
                net = self.networks[nxt.network]
                assert net is not None
                if nxt.deadline is not None and self.queue.size and \
                        net.hopeless(nxt.deadline - now):
                    ready.append(nxt)  # no slot: `_after_free` times it out
                    continue
                self.take_locked(nxt, net)
                ready.append(nxt)
        self.wake()
        return ready

    def _after_free(self, ready: list[Request]) -> None:
        """Start the requests `_free_locked` gave slots; time out those it found hopeless:
        too little of their timeout left to run while others wait behind them (under
        overload the oldest would each start just in time to expire running, and every
        run be wasted; with no one behind, a run that may yet end in time wastes none)."""
        if self.bus.active:
            self.bus.publish("queue.depth", depth=self.queue.size, active=self.slots_used)
        for nxt in ready:
            if nxt.slot:
                self.begin(nxt)
            else:
                net, deadline = self.networks.get(nxt.network), nxt.deadline or time.monotonic()
                self.finish(nxt, None, RequestTimeoutError(
                    f"request {nxt.id} to {nxt.network} timed out in the queue: "
                    f"{max(0.0, deadline - time.monotonic()):.3g} s of its timeout left, and "
                    f"its runs take {net.run_seconds if net else 0:.3g} s"))
        for batcher in self.batchers:
            batcher.slot_freed()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Under the lock: wait for `predicate`, at most `timeout` seconds. A request that
        ends wakes this (`wake`); a lean run ends waking no one (it is the hot path), so
        the predicate is also looked at every `LOOK_AGAIN` seconds."""
        deadline = time.monotonic() + timeout
        self.waiting += 1
        try:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(min(left, LOOK_AGAIN))
            return True
        finally:
            self.waiting -= 1

    # -- starting ------------------------------------------------------------------------

    def cancellable(self, request: Request) -> None:
        """Cancelling the future of `request`, queued, ends it here (a hook bound once, so
        a request pays two fields for it, not an object)."""
        future = request.future
        future.on_cancel, future.request = self.on_cancel, request

    def _cancelled(self, future: RequestFuture) -> None:
        if future.request is not None:
            self.finish(future.request, None, CANCELLED)

    def report_lean(self, record: Request, start: float, error: BaseException | None) -> None:
        """The general path's events for a request the lean path ran, after the run."""
        record.queued_at = record.started_at = start
        self.bus.publish("request.queued", network=record.network, request=record.id,
                         priority=record.priority, queue_depth=0)
        self.bus.publish("request.started", network=record.network, request=record.id,
                         queue_wait=0.0, batch_size=1)
        self._report(record, error)

    def begin(self, request: Request) -> None:
        """Run a request that holds a slot on its replica."""
        if not request.start():
            return  # cancelled or timed out while queued: that path released it
        request.started_at = time.monotonic()
        if self.bus.active:
            self.bus.publish("request.started", network=request.network, request=request.id,
                             queue_wait=request.started_at - request.queued_at, batch_size=1)
        self._start(request)

    def _start(self, request: Request) -> None:
        try:
            request.replica.start(request, self._landed)
        except BaseException as exc:  # a device that raised from `call`, or an interrupt
            self.finish(request, None, exc if isinstance(exc, Exception) else ExecutionError(
                f"request {request.id} to {request.network} interrupted: {described(exc)}"))
            if not isinstance(exc, Exception):
                raise

    def _landed(self, request: Request, outputs: Outputs | None,
                error: BaseException | None) -> None:
        """A started request's end, except that one whose device was lost under it runs
        once more on another replica, if its network has one: retried or failed, never
        both."""
        if isinstance(error, DeviceLostError) and not request.retried and not request.ended:
            with self.lock:
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
                self._start(request)
                return
        self.finish(request, outputs, error)

    def begin_batch(self, batch: Request, done: RequestDone) -> None:
        """Run a batch (its members started by its batcher) on the least busy replica. Its
        deadline is its last member's: a batch stuck on its device gives its slot back
        once every member has ended (`_expire`)."""
        members = batch.members or ()
        with self.lock:
            net = self.networks[batch.network]  # its members' tokens keep it registered
            assert net is not None
            batch.replica = self._least_busy(net)
            net.running.update(members)
        # With one replica its first stage may run right on the batcher's thread when its
        # device is idle: the clients are answered a hand-off sooner, and the batcher forms
        # the next batch as soon as this one is answered. With more, the batcher must stay
        # free to send the next batch to another replica meanwhile, or they take turns.
        batch.inline = len(net.replicas) == 1
        deadlines = [m.deadline for m in members if m.deadline is not None]
        if members and len(deadlines) == len(members):
            batch.deadline = max(deadlines)
            # By the inbox, as its members came, not filed here: taking the inbox in under
            # the lock would file every member's entry on the batcher's thread (~24 us a
            # batch of 64). Taken in when a request ends, mostly this batch as it ends,
            # its members' entries are dropped there instead, their requests ended.
            self.deadlines.add(batch, batch.deadline)
        batch.replica.start(batch, done)

    # -- ending --------------------------------------------------------------------------

    def finish(self, request: Request, outputs: Outputs | None, error: BaseException | None
               ) -> None:
        """The one place a request ends: once, with its outputs or an error (a batch: each
        live member with its rows); reported, then answered (whoever reads the bus once
        the caller has its answer sees the end); its slot or place in line given back."""
        if not request.claim():
            return
        members = request.members
        if members is None:
            ended = [request]
            if self.bus.active:
                self._report(request, error)
            request.settle(outputs, error)
        else:
            parts = split(outputs, members) if outputs is not None else [None] * len(members)
            claimed = [(m, part) for m, part in zip(members, parts, strict=True) if m.claim()]
            ended = [m for m, _ in claimed]
            if self.bus.active:
                for m in ended:
                    self._report(m, error, request.rows)
            request.settle(outputs, error)
            for m, part in claimed:
                m.settle(part, error)
        with self.lock:
            timed = int(request.deadline is not None)  # the request, or the batch
            if request.members is not None:
                timed += sum(m.deadline is not None for m in ended)
            if timed:
                self.deadlines.ended_locked(timed)
            net = self.networks.get(request.network)
            if net is not None:
                if error is None and request.started_at and request.slot:
                    net.ran(time.monotonic() - request.started_at)
                net.running.difference_update(ended)
                for _ in ended:
                    net.accepted.pop()
            freed, request.slot = request.slot, False
            ready = self._free_locked(request.replica) if freed else []
            if not freed:
                self.queue.discard(request)
                self.wake()  # remove_network waits for its last request to end
        if freed:
            self._after_free(ready)
        elif (not request.started_at or request.alone) and net is not None and \
                net.batcher is not None:
            net.batcher.discard(request)

    def _expire(self, request: Request) -> None:
        if request.members is not None:  # a batch: its members time out on their own
            self._release(request)
            return
        where = "running" if request.started_at else "in the queue"
        self.finish(request, None, RequestTimeoutError(
            f"request {request.id} to {request.network} timed out after "
            f"{time.monotonic() - request.queued_at:.3g} s {where}"))

    def _release(self, batch: Request) -> None:
        """A batch past its last member's deadline, still on its device: its slot goes back
        now, so a stuck device holds none. The batch itself ends when its device answers:
        its batcher counts it in flight until then, and sends that device no more."""
        with self.lock:
            if not batch.slot:
                return
            batch.slot = False
            ready = self._free_locked(batch.replica)
        self._after_free(ready)

    def _report(self, request: Request, error: BaseException | None,
                batch_rows: int | None = None) -> None:
        """Publish the request's end; `batch_rows`: the rows of the batch it ran in."""
        now = time.monotonic()
        if error is None:
            self.bus.publish("request.finished", network=request.network, request=request.id,
                             latency=now - request.queued_at,
                             queue_wait=request.started_at - request.queued_at,
                             run_seconds=now - request.started_at, batch_size=request.batch_size,
                             rows=request.rows, batch_rows=batch_rows or request.rows)
        else:
            self.bus.publish("request.failed", network=request.network, request=request.id,
                             error=str(error), partition=getattr(error, "partition", None),
                             device=getattr(error, "device", None),
                             error_type=type(error).__name__)
