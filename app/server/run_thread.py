"""A thread of the server's own that calls `host.run` for the event loop.

Handing a request to the host from the loop (`host.run(..., inline=False)`) queues its
run on the device's worker thread and brings the answer back through a Future chained
into the loop: the admission, its events and that chaining run on the loop, and the
answer crosses two threads. Here the loop hands the whole call over instead (one lock,
one wake-up), the host may run the request right on this thread (its device idle: no
further hand-off, as for any caller of `host.run`), and the answer comes back with one
`call_soon_threadsafe`: a run never blocks the loop, and the loop does less per request.

One request at a time: while this thread is busy, `submit` declines and the caller
hands its request to the host as before, so under load the devices' own workers take
the rest and nothing waits behind this thread. Every submitted request is answered
exactly once: its outputs, its error, or (the thread closed or dying) an error saying so.
A BaseException out of a run on this thread (a device's fault) ends the thread, as the
device interface says it goes on up; the server then serves on without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.errors import HostClosedError, described
from runtime.executor.futures import chain_into
from runtime.host import HostManager

IDLE_POLL = 0.5  # bound on each idle wait; close() also wakes the thread


@dataclass(slots=True)
class _Job:
    loop: asyncio.AbstractEventLoop
    answer: asyncio.Future
    args: tuple[Any, ...]  # host.run's: network, feeds, priority, timeout
    rows: int  # and its rows

    def settle(self, outputs: Any, error: BaseException | None) -> None:
        """Answer the awaiting task, from any thread (a closed loop: nobody waits)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(_resolve, self.answer, outputs, error)


def _resolve(answer: asyncio.Future, outputs: Any, error: BaseException | None) -> None:
    if answer.done():  # the awaiting task was cancelled meanwhile
        return
    if error is None:
        answer.set_result(outputs)
    else:
        answer.set_exception(error)


class RunThread:
    def __init__(self, host: HostManager):
        self.host = host
        self._cv = threading.Condition(threading.Lock())
        self._job: _Job | None = None
        self._busy = False  # a job handed over and not yet given to the host
        self._closed = False
        self.thread = threading.Thread(target=self._work, name="prism-server-run", daemon=True)
        self.thread.start()

    def submit(self, network: str, feeds: Mapping[str, np.ndarray], priority: int,
               timeout: float | None, rows: int = 1) -> asyncio.Future | None:
        """On the event loop: the request's outputs to await, or None when this thread is
        busy or closed (the caller then hands the request to the host itself)."""
        with self._cv:
            if self._busy or self._closed:
                return None
            loop = asyncio.get_running_loop()
            answer = loop.create_future()
            self._job = _Job(loop, answer, (network, feeds, priority, timeout), rows)
            self._busy = True
            self._cv.notify()
        return answer

    def close(self, timeout: float = 5.0) -> None:
        """Take no more requests; the thread ends once the one in hand is with the host."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def _work(self) -> None:
        job: _Job | None = None
        try:
            while True:
                with self._cv:
                    while self._job is None and not self._closed:
                        self._cv.wait(IDLE_POLL)
                    job, self._job = self._job, None
                if job is None:
                    return  # closed, nothing in hand
                if not job.answer.done():  # read across threads: at worst, a wasted run
                    try:
                        future = self.host.run(*job.args, rows=job.rows)
                    except Exception as exc:  # refused: bad input, queue full, closed
                        job.settle(None, exc)
                    else:
                        chain_into(future, job.answer, job.loop)  # at once, if it ran here
                job = None  # handed on: answered from there, never from here
                with self._cv:
                    self._busy = False
        except BaseException as exc:  # nothing may wait on a dead thread
            self._stop(job, HostClosedError(f"the server's run thread stopped: "
                                            f"{described(exc)}"))
            raise

    def _stop(self, job: _Job | None, error: BaseException) -> None:
        with self._cv:
            self._closed = True
            left, self._job = self._job, None
        for stranded in (job, left):
            if stranded is not None:
                stranded.settle(None, error)
