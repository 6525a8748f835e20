"""The lean path: a request to a network of one partition (it reads the graph inputs and
makes the graph outputs), unbatched, runs on the caller's thread when nothing is queued,
waiting for a busy device as for a lock, and comes back as a finished future: no hand-off,
no lock of the host's, no Request record while nobody listens.

It is the general path's pieces, called in one frame: the feeds' check (`FeedCheck`),
the admission check (`Dispatcher.refused`), the executor's run of a one-partition plan
(`Executor.run_now`: the device's `run_now` and the output check every stage passes).
`lean_path(net, slots)` builds that frame once per network, as a closure over what every
request reads.

A lean run holds no slot: like a caller blocked on a locked session, it is one thread
waiting its turn at its device, and no queued request is passed over (none is queued, or
it would not be here). It is counted by a token in `net.lean_runs`, put there before the
admission check: `stop` and `retire` set their flag, then wait for the tokens to go, so
either they see this run or it sees their flag. A run ends waking no one: the waiters look
again every few milliseconds (`Dispatcher.wait_for`).

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
from collections.abc import Mapping

import numpy as np

from runtime.errors import ExecutionError, RequestTimeoutError
from runtime.executor.executor import Executor
from runtime.executor.futures import ReadyFuture
from runtime.executor.requests import Request, checked_timeout
from runtime.host.dispatch import Dispatcher
from runtime.host.serving import LeanRun, ServedNetwork

LEAN_WAIT = 1.0  # seconds a lean caller waits in its device's line before queueing instead


def lean_path(net: ServedNetwork, slots: Dispatcher) -> LeanRun | None:
    """The lean path of `net`, or None if it has none."""
    replica = net.loaded.lean
    if replica is None or replica.run_now is None:
        return None
    check_feeds, tokens, queue, bus = net.check_feeds, net.lean_runs, slots.queue, slots.bus
    run_now, refused, clock = replica.run_now, slots.refused, time.monotonic

    def run(feeds: Mapping[str, object], timeout: float | None, priority: int, rows: int
            ) -> ReadyFuture | dict[str, np.ndarray]:
        checked = check_feeds(feeds)
        timeout = net.timeout if timeout is None else checked_timeout(timeout)
        tokens.append(None)
        try:
            if refused(net) is not None or queue.size:
                return checked  # the general path refuses, or queues it behind the others
            if bus.active:
                return _run_listened(net, replica, slots, checked, timeout, priority, rows
                                     ) or checked
            start = clock()
            try:
                outputs = run_now(checked, LEAN_WAIT if timeout > LEAN_WAIT else timeout)
            except ExecutionError as exc:
                return ReadyFuture(exception=exc)
            if outputs is None:
                return checked
            return ReadyFuture(outputs) if clock() - start <= timeout else _late(net, start)
        finally:
            tokens.pop()

    return run


def _run_listened(net: ServedNetwork, replica: Executor, slots: Dispatcher,
                  feeds: dict[str, np.ndarray], timeout: float, priority: int, rows: int
                  ) -> ReadyFuture | None:
    """A lean run with someone listening: only on an idle device, with a record and the
    general path's events."""
    record = Request(net.name, feeds, priority, rows=rows)
    start = time.monotonic()
    try:
        outputs = replica.run_now(feeds, 0.0, record.id)  # type: ignore[misc]
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


def _late(net: ServedNetwork, start: float) -> ReadyFuture:
    """A lean run's answer, past its timeout: dropped; the request times out."""
    return ReadyFuture(exception=RequestTimeoutError(
        f"request to {net.name} timed out after {time.monotonic() - start:.3g} s running"))
