"""The deadline thread: entries added under its lock or through its inbox (no lock) end
on time, a new earlier deadline wakes it from a longer sleep, and none is lost when many
threads add at once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from runtime.executor.requests import Request
from runtime.host.deadlines import Deadlines

LATE = 1.0  # seconds past its deadline an entry may end: a loaded 2-core machine (or a
# full collection over a large heap) can stall the process for half a second
SLEEP = 3.0  # the deadline the thread sleeps until first: an entry whose wake it missed
# ends there, later than LATE allows


class Expiries:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.at: dict[int, float] = {}
        self.done = threading.Event()
        self.expected = 0
        self.deadlines = Deadlines(self.expire, self.lock)

    def expire(self, request: Request) -> None:
        assert request.claim()
        request.settle(None, TimeoutError("timed out"))
        self.at[request.id] = time.monotonic()
        if len(self.at) == self.expected:
            self.done.set()


@pytest.fixture
def exp():
    """Expiries whose deadline thread is closed however the test ends, so a failure here
    leaves no thread behind for the later tests' thread checks."""
    expiries = Expiries()
    yield expiries
    expiries.deadlines.close()


def test_an_inbox_entry_earlier_than_the_sleep_wakes_the_thread(exp):
    exp.expected = 2
    late, soon = Request("m", {}), Request("m", {})
    now = time.monotonic()
    with exp.lock:
        exp.deadlines.add_locked(late, now + SLEEP)
    time.sleep(0.05)  # the thread sleeps until `late`
    exp.deadlines.add(soon, now + 0.1)
    assert exp.done.wait(10)
    assert now + 0.1 <= exp.at[soon.id] < now + 0.1 + LATE
    assert exp.at[late.id] >= now + SLEEP


def test_entries_added_from_many_threads_without_the_lock_all_end_on_time(exp):
    rng = np.random.default_rng()
    offsets = rng.uniform(0.05, 0.6, (8, 50))  # out of order, across threads
    made: dict[int, float] = {}
    exp.expected = offsets.size + 1
    start = time.monotonic()
    with exp.lock:
        exp.deadlines.add_locked(Request("m", {}), start + SLEEP)
    barrier = threading.Barrier(len(offsets))

    def add(row: np.ndarray) -> None:
        barrier.wait()
        for offset in row:
            request = Request("m", {})
            made[request.id] = start + float(offset)
            exp.deadlines.add(request, made[request.id])

    pool = [threading.Thread(target=add, args=(row,)) for row in offsets]
    for t in pool:
        t.start()
    for t in pool:
        t.join(10)
    assert exp.done.wait(10), f"{len(exp.at)} of {offsets.size} ended"
    for request_id, deadline in made.items():
        assert deadline <= exp.at[request_id] < deadline + LATE


def test_an_ended_request_leaves_without_its_deadline_passing(exp):
    requests = [Request("m", {}) for _ in range(40)]
    for r in requests:
        exp.deadlines.add(r, time.monotonic() + 300)
    for r in requests:
        assert r.claim()
        r.settle({}, None)
        with exp.lock:
            exp.deadlines.ended_locked()
    assert len(exp.deadlines) < len(requests) / 2  # swept, inbox included
