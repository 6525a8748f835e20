"""The futures `host.run` returns: `concurrent.futures.Future`s that cost a request one
lock and one wake-up.

A stock Future builds a Condition (a Python object over an RLock, most of a Future's
cost), and a waiter woken from it must take that RLock again, often from the thread that
just answered: two hand-offs per answer. Here a plain lock guards the state (what
`concurrent.futures.wait` and `as_completed` take as `_condition`), and a second one, the
gate, is held from birth until the future is done: a waiter blocks on the gate, and
answering releases it, one wake-up. Every method of Future that waits or notifies is
overridden; the rest (`done`, `running`, `cancelled`, `_invoke_callbacks`, `__repr__`)
read the same fields as the stock class.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    LOGGER,
    PENDING,
    RUNNING,
)
from contextlib import suppress
from threading import TIMEOUT_MAX, Lock, RLock
from typing import Any

_ENDED = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)


class _Waiters:
    """A future's `_waiters`, made when first asked for: `concurrent.futures.wait` and
    `as_completed` add theirs (under `_condition`), and most futures never meet one. Kept
    in `_waiter_list` (None until then), so that answering a future checks for waiters
    without making a list."""

    def __get__(self, future: Any, owner: type | None = None) -> Any:
        if future is None:
            return self
        if future._waiter_list is None:
            future._waiter_list = []
        return future._waiter_list


class RequestFuture(Future):
    """A request's answer. `on_cancel` (the host's) is called with the future when a
    queued request is cancelled; a started one cannot be. `request` is the request it
    answers, for that hook (set only while it is queued)."""

    # Its fields in slots, not a `__dict__`: a batcher starts and answers sixty in a row,
    # made on other threads, and a `__dict__` was one more cache miss each.
    __slots__ = ("_condition", "_done_callbacks", "_exception", "_gate", "_result", "_state",
                 "_waiter_list", "on_cancel", "request")
    _waiters: Any = _Waiters()

    def __init__(self) -> None:  # not Future's: no Condition
        self._condition: Any = Lock()
        gate = self._gate = Lock()
        gate.acquire()
        self._state, self._result = PENDING, None
        self._exception: BaseException | None = None
        self._waiter_list: list | None = None
        self._done_callbacks: Any = ()  # a list once one is added
        self.on_cancel: Callable[[RequestFuture], None] | None = None
        self.request: Any = None

    def _wait(self, timeout: float | None) -> None:
        """Until done, at most `timeout` seconds (FutureTimeoutError past it)."""
        if self._state not in _ENDED:
            gate = self._gate
            bound = -1.0 if timeout is None or timeout >= TIMEOUT_MAX else max(0.0, timeout)
            if not gate.acquire(timeout=bound):
                raise FutureTimeoutError()
            gate.release()  # open for every other waiter

    def result(self, timeout: float | None = None) -> Any:
        if timeout is None and self._state not in _ENDED:  # `_wait`, inline: the usual call
            gate = self._gate
            gate.acquire()
            gate.release()
        else:
            self._wait(timeout)
        if self._state is not FINISHED:
            raise CancelledError()
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        if self._state is not FINISHED:
            raise CancelledError()
        return self._exception

    def settle(self, result: Any, exception: BaseException | None) -> bool:
        """End with `result` or `exception`; False if it had ended (been cancelled)."""
        with self._condition:  # not reentrant: nothing in here may take it (repr does)
            if self._state in _ENDED:
                return False
            self._result, self._exception, self._state = result, exception, FINISHED
            for waiter in self._waiter_list or ():  # wait / as_completed
                if exception is None:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
        self._gate.release()
        if self._done_callbacks:
            self._invoke_callbacks()  # type: ignore[attr-defined]  # Future's own
        return True

    def set_result(self, result: Any) -> None:
        if not self.settle(result, None):
            raise InvalidStateError(f"{self._state}: {self!r}")

    def set_exception(self, exception: BaseException | None) -> None:
        if not self.settle(None, exception):
            raise InvalidStateError(f"{self._state}: {self!r}")

    def cancel(self) -> bool:
        with self._condition:
            if self._state in (RUNNING, FINISHED):
                return False
            if self._state is not PENDING:
                return True
            self._state = CANCELLED
        self._gate.release()
        self._invoke_callbacks()  # type: ignore[attr-defined]  # Future's own
        if self.on_cancel is not None:
            self.on_cancel(self)
        return True

    def set_running_or_notify_cancel(self) -> bool:
        with self._condition:
            if self._state is CANCELLED:
                self._state = CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    waiter.add_cancelled(self)
                return False
            if self._state is PENDING:
                self._state = RUNNING
                return True
        raise RuntimeError(f"Future in unexpected state: {self._state}")

    def add_done_callback(self, fn: Callable[[Future], object]) -> None:
        with self._condition:
            if self._state not in _ENDED:
                self._done_callbacks = [*self._done_callbacks, fn]
                return
        try:
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)


class ReadyFuture(RequestFuture):
    """Born finished, for a request that ran on the caller's thread: no gate to open, and
    one lock shared by all (reentrant: `concurrent.futures.wait` takes every future's in
    turn), since nothing ever changes their state. What every one holds alike is held by
    the class, so making one sets one field (its result) or two."""

    _condition = RLock()
    _state = FINISHED  # a finished future calls a callback at once and keeps none
    # These shadow their slots: what every one holds alike stays on the class
    _exception: BaseException | None = None
    _done_callbacks = ()
    _waiter_list = on_cancel = request = None
    # `wait` adds a waiter to every future it is given and takes it off again, under
    # `_condition`; nothing answers a waiter here, so one list serves all
    _waiters: list = []  # noqa: RUF012 (shared on purpose)

    def __init__(self, result: Any = None, exception: BaseException | None = None):
        self._result = result
        if exception is not None:
            self._exception = exception

    def _wait(self, timeout: float | None) -> None:
        pass

    def result(self, timeout: float | None = None) -> Any:  # the lean path's: one call
        if self._exception is not None:
            raise self._exception
        return self._result


async def answer_of(future: Future) -> Any:
    """Await `future` from asyncio with one callback and one call on the loop
    (`asyncio.wrap_future` adds a callback to each side and a second call on the loop per
    answer, a fifth of what a batched request costs a loop). Cancelling the awaiting task
    cancels the future, which a request that has started refuses."""
    import asyncio  # here: a host that never awaits skips its import (cold start)

    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    chain_into(future, waiter, loop)
    try:
        return await waiter
    except asyncio.CancelledError:
        future.cancel()
        raise


def chain_into(future: Future, waiter: Any, loop: Any) -> None:
    """When `future` ends, give its outcome to the asyncio future `waiter` on `loop`: one
    callback, one call on the loop (a closed loop: nobody awaits any more)."""

    def landed(done: Future) -> None:
        with suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, waiter, done)

    future.add_done_callback(landed)


def _settle(waiter: Any, done: Future) -> None:
    if waiter.done():  # its awaiting task was cancelled meanwhile
        return
    if done.cancelled():
        waiter.cancel()
    elif (error := done.exception()) is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(done.result())

