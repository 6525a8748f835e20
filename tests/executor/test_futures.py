"""The host's futures behave as `concurrent.futures.Future` does wherever users hand one:
waiting with and without a bound, `wait`, `as_completed`, callbacks, cancellation,
`asyncio.wrap_future`, and many threads waiting on one future."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import random
import threading
import time

import pytest

from runtime.executor.futures import ReadyFuture, RequestFuture

WAIT = 10.0


def answered_later(future: RequestFuture, value: object, after: float) -> threading.Timer:
    timer = threading.Timer(after, future.set_result, (value,))
    timer.start()
    return timer


def test_result_waits_for_the_answer_and_a_bound_raises_timeout():
    future, value = RequestFuture(), random.random()
    with pytest.raises(cf.TimeoutError):
        future.result(timeout=0.01)
    assert not future.done() and not future.running()
    answered_later(future, value, 0.05).join(WAIT)
    assert future.result(timeout=WAIT) == value and future.done()
    assert future.exception(timeout=0) is None
    with pytest.raises(cf.InvalidStateError):
        future.set_result(value)


def test_an_exception_is_raised_to_every_waiter():
    future, error = RequestFuture(), ValueError(f"bad {random.random()}")
    seen: list[BaseException | None] = []
    waiters = [threading.Thread(target=lambda: seen.append(future.exception(WAIT)))
               for _ in range(16)]
    for t in waiters:
        t.start()
    time.sleep(0.02)
    future.set_exception(error)
    for t in waiters:
        t.join(WAIT)
    assert seen == [error] * 16
    with pytest.raises(ValueError, match="bad"):
        future.result(0)


def test_wait_and_as_completed_see_every_end():
    futures = [RequestFuture() for _ in range(20)]
    order = random.sample(range(20), 20)
    timers = [answered_later(futures[i], i, 0.002 * rank) for rank, i in enumerate(order)]
    first = cf.wait(futures, timeout=WAIT, return_when=cf.FIRST_COMPLETED)
    assert first.done
    assert sorted(f.result() for f in cf.as_completed(futures, timeout=WAIT)) == list(range(20))
    done, not_done = cf.wait(futures, timeout=WAIT)
    assert len(done) == 20 and not not_done
    for t in timers:
        t.join(WAIT)


def test_callbacks_run_once_when_added_before_or_after_the_end():
    future, calls = RequestFuture(), []
    future.add_done_callback(calls.append)
    future.set_result(1)
    future.add_done_callback(calls.append)
    assert calls == [future, future]


def test_cancel_only_before_running_and_it_calls_the_hook():
    queued, hooked = RequestFuture(), []
    queued.on_cancel = lambda future: hooked.append(future is queued)
    assert queued.cancel() and queued.cancelled() and hooked == [True]
    assert queued.cancel()  # again: still cancelled, the hook not run twice
    assert hooked == [True]
    with pytest.raises(cf.CancelledError):
        queued.result(0)
    assert not queued.set_running_or_notify_cancel()
    with pytest.raises(cf.InvalidStateError):
        queued.set_result(1)
    running = RequestFuture()
    assert running.set_running_or_notify_cancel() and running.running()
    assert not running.cancel()
    running.set_result(2)
    assert running.result(0) == 2


def test_wait_sees_a_cancellation_once_notified_as_with_a_stock_future():
    future = RequestFuture()

    def cancel() -> None:
        future.cancel()
        future.set_running_or_notify_cancel()

    threading.Timer(0.02, cancel).start()
    done, _ = cf.wait([future], timeout=WAIT)
    assert future in done and future.cancelled()


def test_asyncio_wrap_future_gets_results_and_cancels_the_source():
    async def main() -> None:
        answered = RequestFuture()
        answered_later(answered, "x", 0.01)
        assert await asyncio.wait_for(asyncio.wrap_future(answered), WAIT) == "x"
        failing = RequestFuture()
        threading.Timer(0.01, failing.set_exception, (KeyError("k"),)).start()
        with pytest.raises(KeyError):
            await asyncio.wait_for(asyncio.wrap_future(failing), WAIT)
        queued = RequestFuture()
        task = asyncio.ensure_future(asyncio.wrap_future(queued))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)  # the source is cancelled by a callback the loop runs
        assert queued.cancelled()

    asyncio.run(main())


def test_a_ready_future_is_done_at_birth():
    value = random.random()
    assert ReadyFuture(value).result(0) == value
    assert ReadyFuture(exception=OSError("e")).exception(0).args == ("e",)
    assert not ReadyFuture(value).cancel()
    assert cf.wait([ReadyFuture(value)], timeout=0).done
    calls: list = []
    ReadyFuture(value).add_done_callback(calls.append)
    assert len(calls) == 1
