"""One thread that ends requests whose timeout has passed, queued or running."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable

from runtime.requests import Request


class Deadlines:
    def __init__(self, on_expire: Callable[[Request], None]):
        self._on_expire = on_expire
        self._heap: list[tuple[float, int, Request]] = []
        self._ended = 0  # entries of ended requests since the last sweep (at most)
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="prism-deadlines", daemon=True)
        self._thread.start()

    def add(self, request: Request) -> None:
        if request.deadline is None:
            return
        with self._cv:
            heapq.heappush(self._heap, (request.deadline, request.id, request))
            if self._heap[0][2] is request:
                self._cv.notify()

    def discard(self, request: Request) -> None:
        """`request` has ended. Its entry goes at the next sweep, once half the heap has
        ended: a finished request, and the outputs it holds, need not wait for its deadline
        to be let go (under load with long timeouts, that would be most of the heap)."""
        with self._cv:
            self._ended += 1
            if self._ended * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].ended]
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
                    self._cv.wait(self._heap[0][0] - now if self._heap else None)
                if self._closed:
                    return
                expired = heapq.heappop(self._heap)[2]
            self._on_expire(expired)

    def close(self, timeout: float = 2.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)
