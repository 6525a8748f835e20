"""One thread that ends requests whose timeout has passed, queued or running.

It shares the dispatcher's lock: a request is entered where it is admitted and counted
out where it ends, each under a lock its caller holds already, so a timeout (on by
default, `HostManager(timeout=...)`) costs a request no lock of its own. A caller holding
no lock (a batched request, admitted by its batcher; a batch as it starts) drops its entry
in an inbox instead, which the thread, or the next request to end, takes in under the
lock (an entry whose request has ended by then is dropped, not filed); the thread is
woken only when it would otherwise sleep past the new deadline.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable

from runtime.executor.requests import Request


class Deadlines:
    """Requests by deadline. Most come in deadline order (one timeout, arrival order):
    those join a FIFO, appended and popped at O(1); the rest, a heap."""

    def __init__(self, on_expire: Callable[[Request], None], lock: threading.RLock):
        self._on_expire = on_expire
        self._fifo: deque[tuple[float, Request]] = deque()  # deadlines never decreasing
        self._heap: list[tuple[float, int, Request]] = []
        self._inbox: deque[tuple[float, Request]] = deque()  # added without the lock
        self._ended = 0  # entries of ended requests since the last sweep (at most)
        self._cv = threading.Condition(lock)
        self._wake_at = math.inf  # when the thread wakes next, unless notified
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="prism-deadlines", daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        return len(self._fifo) + len(self._heap) + len(self._inbox)

    def add_locked(self, request: Request, deadline: float) -> None:
        """Under the lock: time `request` out at `deadline` (its own)."""
        self._take_inbox()
        self._insert(deadline, request)
        if deadline < self._wake_at:  # only then: a thread woken per request costs more
            self._cv.notify()         # than the rest of its timeout does

    def add(self, request: Request, deadline: float) -> None:
        """Without the lock: `add_locked`, by way of the inbox. The thread publishes when it
        will wake next before it looks at the inbox a last time and sleeps, so either it
        sees this entry or this sees its wake time (deque appends are atomic)."""
        self._inbox.append((deadline, request))
        if deadline < self._wake_at:
            with self._cv:
                self._cv.notify()

    def _insert(self, deadline: float, request: Request) -> None:
        fifo = self._fifo
        if not fifo or deadline >= fifo[-1][0]:
            fifo.append((deadline, request))
        else:
            heapq.heappush(self._heap, (deadline, request.id, request))

    def _take_inbox(self) -> None:
        """Under the lock: the inbox's entries into the FIFO (or the heap)."""
        inbox, fifo = self._inbox, self._fifo
        while inbox:
            entry = inbox.popleft()
            if entry[1].ended:
                continue
            if not fifo or entry[0] >= fifo[-1][0]:  # `_insert`, inline: one per request
                fifo.append(entry)
            else:
                heapq.heappush(self._heap, (entry[0], entry[1].id, entry[1]))

    def ended_locked(self, count: int = 1) -> None:
        """Under the lock: `count` timed requests have ended. Their entries go at the next
        sweep, once half the entries have ended: a finished request, and the outputs it
        holds, need not wait for its deadline to be let go (under load with long
        timeouts, that would be most of them)."""
        self._take_inbox()
        self._drop_ended_heads()
        self._ended += count
        if not self._fifo and not self._heap:
            self._ended = 0
        elif self._ended * 2 > len(self):
            self._fifo = deque(e for e in self._fifo if not e[1].ended)
            self._heap = [e for e in self._heap if not e[2].ended]
            heapq.heapify(self._heap)
            self._ended = 0

    def _drop_ended_heads(self) -> None:
        fifo, heap = self._fifo, self._heap
        while fifo and fifo[0][1].ended:  # the usual case: the oldest end first
            fifo.popleft()
        while heap and heap[0][2].ended:
            heapq.heappop(heap)

    def _earliest(self) -> float:
        return min(self._fifo[0][0] if self._fifo else math.inf,
                   self._heap[0][0] if self._heap else math.inf)

    def _pop_earliest(self) -> Request:
        if self._heap and (not self._fifo or self._heap[0][0] < self._fifo[0][0]):
            return heapq.heappop(self._heap)[2]
        return self._fifo.popleft()[1]

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed:
                    self._take_inbox()
                    now = time.monotonic()
                    self._drop_ended_heads()
                    earliest = self._earliest()
                    if earliest <= now:
                        break
                    self._wake_at = earliest
                    if not self._inbox:  # else one came meanwhile: take it in first
                        self._cv.wait(None if earliest == math.inf else earliest - now)
                if self._closed:
                    return
                expired = self._pop_earliest()
            self._on_expire(expired)

    def close(self, timeout: float = 2.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)
