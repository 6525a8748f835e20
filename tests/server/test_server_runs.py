"""The server's run thread (`app/server/run_thread.py`): a request leaves the event loop
for it, runs there or on its device's worker, never on the loop's thread, and is answered
exactly once, whatever happens to it or to the thread."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from app.server.calls import run
from app.server.run_thread import RunThread
from runtime.devices import parse_devices
from runtime.errors import ExecutionError, HostClosedError, InvalidInputError
from runtime.host import HostManager
from tests.support.fakes import FaultyManager, Gate
from tests.support.serving import MLP, WAIT, assert_same, expected

ENDINGS = ("request.finished", "request.failed")


def _feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((1, 256), np.float32)}


def _host() -> HostManager:
    host = HostManager(parse_devices("cpu:1"), device_factory=FaultyManager)
    host.add_network("mlp", MLP)
    return host


def _threads_of_runs(host: HostManager) -> list[str]:
    """The names of the threads the device's runs happen on, from now on."""
    names: list[str] = []
    host.devices["cpu0"].fail = lambda call, feeds: names.append(  # type: ignore[attr-defined]
        threading.current_thread().name) or 0
    return names


def _on_loop(main: Callable[[], object]) -> object:
    return asyncio.run(asyncio.wait_for(main(), WAIT))  # type: ignore[arg-type]


def test_runs_leave_the_loop_and_each_request_ends_once():
    rng = np.random.default_rng()
    feeds = [_feeds(rng) for _ in range(120)]
    with _host() as host:
        ended = host.bus.subscribe(kinds=ENDINGS)  # the server always listens
        ran_on = _threads_of_runs(host)
        runs = RunThread(host)

        async def main() -> tuple[str, list]:
            one_by_one = [await run(runs, "mlp", f, 0, None) for f in feeds[:40]]
            at_once = await asyncio.gather(*(run(runs, "mlp", f, 0, None) for f in feeds[40:]))
            return threading.current_thread().name, one_by_one + list(at_once)

        loop_thread, got = _on_loop(main)
        runs.close(WAIT)
        counts = Counter(e["request"] for e in ended.drain() if e.kind in ENDINGS)
    for f, out in zip(feeds, got, strict=True):
        assert_same(out, expected(MLP, f))
    assert len(ran_on) == len(feeds) and loop_thread not in ran_on
    assert "prism-server-run" in ran_on  # an idle device ran the request on the thread
    assert len(counts) == len(feeds) and set(counts.values()) == {1}
    assert not runs.thread.is_alive()


def test_a_busy_thread_declines_and_close_answers_the_request_it_holds():
    rng = np.random.default_rng()
    held_feeds, other_feeds = _feeds(rng), _feeds(rng)
    with _host() as host:
        gate = host.devices["cpu0"].gate = Gate()  # type: ignore[attr-defined]
        runs = RunThread(host)

        async def main() -> tuple:
            held = asyncio.ensure_future(run(runs, "mlp", held_feeds, 0, None))
            assert await asyncio.to_thread(gate.entered.wait, WAIT)  # running on the thread
            assert runs.submit("mlp", other_feeds, 0, None) is None  # busy: declined
            other = asyncio.ensure_future(run(runs, "mlp", other_feeds, 0, None))  # the host's
            runs.close(timeout=0.01)  # bounded, though its thread holds a run
            assert runs.thread.is_alive() and runs.submit("mlp", other_feeds, 0, None) is None
            gate.opened.set()
            return await held, await other

        held, other = _on_loop(main)
        runs.thread.join(WAIT)
    assert_same(held, expected(MLP, held_feeds))
    assert_same(other, expected(MLP, other_feeds))
    assert not runs.thread.is_alive()


def test_errors_reach_the_awaiting_request():
    rng = np.random.default_rng()
    with _host() as host:
        host.devices["cpu0"].fail = lambda call, feeds: call == 1  # type: ignore[attr-defined]
        runs = RunThread(host)

        async def main() -> dict:
            with pytest.raises(ExecutionError, match="injected fault"):
                await run(runs, "mlp", _feeds(rng), 0, None)
            with pytest.raises(InvalidInputError):
                await run(runs, "mlp", {"x": np.zeros((1, 3), np.float32)}, 0, None)
            return await run(runs, "mlp", good := _feeds(rng), 0, None) | {"feeds": good}

        got = _on_loop(main)
        runs.close(WAIT)
    feeds = got.pop("feeds")
    assert_same(got, expected(MLP, feeds))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dying_thread_answers_its_request_and_the_server_serves_on():
    rng = np.random.default_rng()
    with _host() as host:
        host.devices["cpu0"].fail = (  # type: ignore[attr-defined]
            lambda call, feeds: KeyboardInterrupt if call == 1 else 0)
        runs = RunThread(host)

        async def main() -> tuple:
            with pytest.raises(HostClosedError, match="run thread stopped: KeyboardInterrupt"):
                await run(runs, "mlp", _feeds(rng), 0, None)
            await asyncio.to_thread(runs.thread.join, WAIT)
            return not runs.thread.is_alive(), await run(runs, "mlp", after := _feeds(rng), 0,
                                                          None), after

        ended, got, after = _on_loop(main)
    assert ended
    assert_same(got, expected(MLP, after))
