"""The host's event bus as a numbered log, for the event stream (`routes/watch.py`).

One subscription is drained into a ring of the last `keep` events, each with its sequence
number, so a client resumes after the last number it saw (SSE's `Last-Event-ID`). A client
that fell behind the ring is told how many events it lost with a `bus.lost` event, as a
local subscriber is. Events the subscription itself dropped (nobody asked for a while) use
up their numbers, so they count as lost the same way.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque

from runtime.observe.events import Event, EventBus

KEEP = 50_000  # events kept for clients to resume from


class EventLog:
    def __init__(self, bus: EventBus, keep: int | None = None):
        keep = keep or KEEP
        self._subscription = bus.subscribe(maxlen=keep)
        self._ring: deque[tuple[int, Event]] = deque(maxlen=keep)
        self._next = 1  # the number the next event gets
        self._lock = threading.Lock()

    def since(self, after: int) -> list[tuple[int, Event]]:
        """The events numbered above `after`, oldest first, led by a `bus.lost` (numbered
        `after`) when some of them have left the ring."""
        with self._lock:
            for event in self._subscription.drain():
                if event.kind == "bus.lost":  # dropped before they were numbered
                    self._next += event["lost"]
                    continue
                self._ring.append((self._next, event))
                self._next += 1
            first = self._ring[0][0] if self._ring else self._next
            start = max(0, after + 1 - first)
            # Nothing new is the usual answer to a stream's poll: no walk over the ring.
            out = list(itertools.islice(self._ring, start, None)) \
                if start < len(self._ring) else []
        gone = first - after - 1
        if gone > 0 and after >= 0:
            out.insert(0, (after, Event("bus.lost", out[0][1].ts if out else 0.0,
                                        {"lost": gone})))
        return out

    @property
    def last(self) -> int:
        """The number of the newest event logged so far."""
        with self._lock:
            return self._next - 1

    def close(self) -> None:
        self._subscription.close()
