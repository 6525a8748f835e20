"""`host.run_async`: thousands of coroutines on one event loop, no thread per request."""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np
import pytest

from runtime.devices import parse_devices
from runtime.errors import InvalidInputError, QueueFullError, RequestTimeoutError
from runtime.host import HostManager
from tests.support.serving import MLP, WAIT, assert_same, expected, idle, poll

COROUTINES = 3000


def _feeds(rng: np.random.Generator, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((rows, 256), np.float32)}


@pytest.mark.parametrize("batching", [None, {"max_batch_size": 32, "max_queue_delay_ms": 1}])
def test_thousands_of_coroutines_each_get_their_own_answer(batching):
    rng = np.random.default_rng()
    feeds = [_feeds(rng) for _ in range(COROUTINES)]
    threads_before = threading.active_count()
    with HostManager(parse_devices("cpu:2"), max_queue=COROUTINES,
                     max_active=64) as host:
        host.add_network("mlp", MLP, batching=batching)
        seen_threads: list[int] = []

        async def one(f: dict) -> dict:
            out = await host.run_async("mlp", f)
            seen_threads.append(threading.active_count())
            return out

        async def main() -> list:
            return await asyncio.wait_for(asyncio.gather(*(one(f) for f in feeds)), WAIT)

        got = asyncio.run(main())
        assert poll(lambda: idle(host))
    for f, out in zip(feeds, got, strict=True):
        assert_same(out, expected(MLP, f))
    # Devices, batcher and deadline workers only: a request costs no thread of its own.
    assert max(seen_threads) - threads_before < 16


def test_errors_and_cancellation_reach_the_awaiting_coroutine():
    rng = np.random.default_rng()
    # A slow device (8 rows: ~0.2 s), so the running request is still running while the
    # loop sends the others, however loaded the machine.
    with HostManager(parse_devices("sim:1:flops=50M"), max_queue=4, max_active=1) as host:
        host.add_network("mlp", MLP)

        async def main() -> None:
            with pytest.raises(InvalidInputError):
                await host.run_async("mlp", {"x": np.zeros((1, 3), np.float32)})
            with pytest.raises(RequestTimeoutError):
                await host.run_async("mlp", _feeds(rng), timeout=1e-4)
            # One runs, four wait, the sixth is refused; a cancelled waiter gives its
            # place back and the others still finish.
            tasks = [asyncio.ensure_future(host.run_async("mlp", _feeds(rng, 8)))
                     for _ in range(5)]
            await asyncio.sleep(0)
            with pytest.raises(QueueFullError):
                await host.run_async("mlp", _feeds(rng))
            tasks[-1].cancel()
            done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT)
            assert isinstance(done[-1], asyncio.CancelledError)
            assert all(isinstance(d, dict) for d in done[:-1])

        asyncio.run(main())
        assert poll(lambda: idle(host))


def test_an_answer_after_its_loop_has_closed_is_dropped_quietly(caplog):
    rng = np.random.default_rng()
    with HostManager(parse_devices("sim:1:flops=10M")) as host:
        host.add_network("mlp", MLP)

        async def main() -> None:  # leaves its request running (~1 s on this device: long
            # enough that a loop starved by a busy machine still finds it running)
            task = asyncio.ensure_future(host.run_async("mlp", _feeds(rng, 8)))
            await asyncio.sleep(0.02)
            assert not task.done()

        with caplog.at_level(logging.ERROR):
            asyncio.run(main())  # cancels the task; the started request runs on
            assert poll(lambda: idle(host))
        assert host.stats().outstanding == {"mlp": 0}
        assert not caplog.records, [r.getMessage() for r in caplog.records]
