"""The lean path: a request to a network of one partition (it reads the graph inputs and
makes the graph outputs), unbatched, runs on the caller's thread when nothing is queued,
waiting for a busy device as for a lock, and comes back as a finished future: no hand-off,
no lock of the host's, no Request record while nobody listens.

`lean_run(net, slots)` builds, once per network, the one function `host.run` calls for
it. Under 64 client threads a request's Python is what the others queue behind, and each
call frame costs ~2.5 % of the rate, so the whole run is one frame: the feeds' check, the
admission, the device's lock and onnxruntime's binding (`Device.inline_program`), the outputs'
check and the future. A device that hands out no `InlineProgram` runs through its
`runner` instead (`Executor.run_inline`), one frame more.

A lean run holds no slot: like a caller blocked on a locked session, it is one thread
waiting its turn at its device, and no queued request is passed over (none is queued, or
it would not be here). It is counted by a token in `net.lean_runs`, put there before the
checks: `stop` and `retire` set their flag, then wait for the tokens to go, so either
they see this run or it sees their flag.

The run holds this thread, so its deadline is not a timer's: nothing could answer the
caller sooner. An answer later than the timeout is dropped and the request ends timed
out, as a request on the general path would.

With someone listening, only an idle device runs it here (a busy one sends it down the
general path, where its wait is queued by priority and seen), the request gets a record,
and its events are the general path's: the device's partition.run pair as it runs, then
request.queued, request.started and its end, published once the run is over (a request
that goes on to the general path has published nothing here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from runtime.devices.device import bad_result
from runtime.errors import ExecutionError, RequestTimeoutError
from runtime.executor.futures import ReadyFuture
from runtime.executor.requests import Request, checked_timeout
from runtime.inputs import check_feeds

if TYPE_CHECKING:
    from runtime.executor.executor import Executor
    from runtime.host.dispatch import Dispatcher
    from runtime.provision.network import Network

LEAN_WAIT = 1.0  # seconds a lean caller waits in its device's line before queueing instead

# run(feeds, timeout, priority): a finished future, or None to take the general path (the
# host closing, the network going, something queued, the device closed or busy LEAN_WAIT)
LeanRun = Callable[[Mapping[str, object], "float | None", int], "Future | None"]


def lean_run(net: Network, slots: Dispatcher) -> LeanRun | None:
    """The lean path of `net`, or None if it has none (or its device never runs inline)."""
    replica = net.lean
    if replica is None or replica.run_inline is None:
        return None
    part = replica.parts[0]
    program = part.device.inline_program(part.key) if set(part.partition.outputs) == set(
        replica.outputs) else None
    device_run, check, failure = replica.run_inline, replica.checks[0], replica.failure
    name, specs, width, tokens = net.name, net.specs, len(net.specs), net.lean_runs
    queue, bus, clock = slots.queue, slots.bus, time.monotonic
    names = list(replica.outputs)
    first = names[0] if len(names) == 1 else None
    declared = {tensor: (dtype, seen) for tensor, dtype, seen in check.expected}
    expected = [declared[tensor] for tensor in names] if program is not None else []
    if program is not None:
        lock, call, thread, account = program.lock, program.call, program.thread, program.account

    def run(feeds: Mapping[str, object], timeout: float | None, priority: int
            ) -> Future | None:
        if program is None or bus.active:
            return _run_through(feeds, timeout, priority)
        # What `run_now` does, in this frame (see `InlineProgram`), the device first: the
        # race (docs/architecture.md, the lean path) is lost only while this thread is
        # away from its device's lock, so everything that can be done holding it is.
        start = clock()
        held = lock.acquire(False)
        try:
            if type(feeds) is dict and len(feeds) == width:
                # `check_feeds`' short pass, inline; the run reads the caller's dict
                # before this returns, so it is not copied
                for spec in specs:
                    value = feeds.get(spec.name)
                    if type(value) is not np.ndarray or value.dtype is not spec.dtype or \
                            value.shape not in spec.shapes_seen:
                        feeds = check_feeds(name, specs, feeds)
                        break
            else:
                feeds = check_feeds(name, specs, feeds)
            timeout = net.timeout if timeout is None else checked_timeout(timeout)
            if not held:
                if thread.device or not lock.acquire(
                        True, LEAN_WAIT if timeout > LEAN_WAIT else timeout):
                    return None
                held = True
            tokens.append(None)
            try:
                if slots.closing or net.removing or queue.size or thread.device or \
                        not program.live:
                    return None
                thread.device = True
                began = clock()
                try:
                    values = call(names, feeds, None)
                except Exception as exc:
                    return ReadyFuture(exception=failure(program.failed(exc)))
                finally:
                    end = clock()
                    account.runs += 1
                    account.busy_seconds += end - began
                    thread.device = False
                outputs = {first: values[0]} if first is not None else dict(
                    zip(names, values, strict=True))
                for value, (dtype, seen) in zip(values, expected, strict=True):
                    # `check.problem`'s short pass, inline: a shape seen before
                    if type(value) is not np.ndarray or value.shape not in seen or \
                            (value.dtype is not dtype and dtype is not None):
                        if (problem := check.problem(outputs)) is not None:
                            return ReadyFuture(exception=failure(bad_result(
                                part.device.name, part.key, problem)))
                        break
                return ReadyFuture(outputs) if end - start <= timeout else _late(net, start)
            finally:
                tokens.pop()  # the run is over: the device's release is all that is left
                held = False
                lock.release()
                if slots.waiting:  # stop or retire may be waiting for this run's end
                    with slots.lock:
                        slots.cv.notify_all()
        finally:
            if held:  # the feeds or the timeout were refused
                lock.release()

    def _run_through(feeds: Mapping[str, object], timeout: float | None, priority: int
                     ) -> Future | None:
        """The lean run with someone listening, or on a device with no `InlineProgram`
        (its `runner`, by way of the executor)."""
        checked = check_feeds(name, specs, feeds)
        timeout = net.timeout if timeout is None else checked_timeout(timeout)
        tokens.append(None)
        try:
            if slots.closing or net.removing or queue.size:
                return None
            if bus.active:
                return _run_listened(net, replica, slots, checked, timeout, priority)
            start = clock()
            try:
                outputs = device_run(checked, LEAN_WAIT if timeout > LEAN_WAIT else timeout)
            except Exception as exc:
                return ReadyFuture(exception=failure(exc))
            if outputs is None:
                return None
            return ReadyFuture(outputs) if clock() - start <= timeout else _late(net, start)
        finally:
            tokens.pop()
            if slots.waiting:
                with slots.lock:
                    slots.cv.notify_all()

    return run


def _run_listened(net: Network, replica: Executor, slots: Dispatcher,
                  feeds: dict[str, np.ndarray], timeout: float, priority: int
                  ) -> Future | None:
    """A lean run with someone listening: only on an idle device, with a record and the
    general path's events."""
    record = Request(net.name, feeds, priority)
    start = time.monotonic()
    try:
        outputs = replica.run_now(feeds, 0.0, record.id)
        if outputs is None:
            return None
        future = ReadyFuture(outputs) if time.monotonic() - start <= timeout else \
            _late(net, start)
    except ExecutionError as exc:
        future = ReadyFuture(exception=exc)
    except BaseException as exc:  # an interrupt landing in the run: it ended; go on up
        slots.report_lean(record, start, exc)
        raise
    slots.report_lean(record, start, future.exception())
    return future


def _late(net: Network, start: float) -> ReadyFuture:
    """A lean run's answer, past its timeout: dropped; the request times out."""
    return ReadyFuture(exception=RequestTimeoutError(
        f"request to {net.name} timed out after {time.monotonic() - start:.3g} s running"))
