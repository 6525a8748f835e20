"""One thread that ends requests whose timeout has passed, queued or running.

It shares the dispatcher's lock: a request is entered where it is admitted and counted
out where it ends, each under a lock its caller holds already, so a timeout (on by
default, `HostManager(timeout=...)`) costs a request no lock of its own.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable

from runtime.requests import Request


class Deadlines:
    def __init__(self, on_expire: Callable[[Request], None], lock: threading.RLock):
        self._on_expire = on_expire
        self._heap: list[tuple[float, int, Request]] = []
        self._ended = 0  # entries of ended requests since the last sweep (at most)
        self._cv = threading.Condition(lock)
        self._wake_at = math.inf  # when the thread wakes next, unless notified
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="prism-deadlines", daemon=True)
        self._thread.start()

    def add_locked(self, request: Request, deadline: float) -> None:
        """Under the lock: time `request` out at `deadline` (its own)."""
        heapq.heappush(self._heap, (deadline, request.id, request))
        if deadline < self._wake_at:  # only then: a thread woken per request costs more
            self._cv.notify()         # than the rest of its timeout does

    def ended_locked(self, count: int = 1) -> None:
        """Under the lock: `count` timed requests have ended. Their entries go at the next
        sweep, once half the heap has ended: a finished request, and the outputs it holds,
        need not wait for its deadline to be let go (under load with long timeouts, that
        would be most of the heap)."""
        heap = self._heap
        while heap and heap[0][2].ended:  # the usual case: the oldest end first
            heapq.heappop(heap)
        self._ended += count
        if not heap:
            self._ended = 0
        elif self._ended * 2 > len(heap):
            self._heap = [entry for entry in heap if not entry[2].ended]
            heapq.heapify(self._heap)
            self._ended = 0

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed:
                    now = time.monotonic()
                    while self._heap and self._heap[0][2].ended:
                        heapq.heappop(self._heap)
                    if self._heap and self._heap[0][0] <= now:
                        break
                    self._wake_at = self._heap[0][0] if self._heap else math.inf
                    self._cv.wait(self._wake_at - now if self._heap else None)
                if self._closed:
                    return
                expired = heapq.heappop(self._heap)[2]
            self._on_expire(expired)

    def close(self, timeout: float = 2.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)
