"""A request's record, and the bounded priority queue requests wait in."""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from runtime.errors import PrismError
from runtime.executor.futures import RequestFuture
from runtime.types import Outputs

_ids = itertools.count(1)
DEFAULT_TIMEOUT = 300.0  # seconds: a request's timeout unless its host or network says


def checked_timeout(value: object, what: str = "timeout") -> float:
    """A timeout in seconds: a number above 0, math.inf for none."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise PrismError(f"{what} must be a number of seconds above 0 (math.inf: none), "
                         f"got {value!r}")
    return float(value)


@dataclass(eq=False, slots=True)
class Request:
    network: str
    feeds: dict[str, np.ndarray]
    priority: int = 0
    deadline: float | None = None
    queued_at: float = 0.0
    rows: int = 1  # inferences it counts as: its first dimension when its network batches
    slot: bool = False  # holds one of the host's `max_active` slots
    inline: bool = False  # may run on the caller's thread
    waited: bool = False  # its caller waits for it: every stage may run on its thread
    members: list[Request] | None = None  # a batch: the requests it runs as one
    # set as it goes, never passed: not parameters (a default parameter costs every call)
    started_at: float = field(init=False, default=0.0)
    batch_size: int = field(init=False, default=1)  # requests in the batch it ran in
    key: tuple = field(init=False, default=())  # what must agree to share a batch (batch_key)
    alone: bool = field(init=False, default=False)  # in a batch of its own: its batch failed
    replica: Any = field(init=False, default=None)  # the Executor (one replica) running it
    retried: bool = field(init=False, default=False)  # run again after its device was lost
    id: int = field(init=False, default_factory=_ids.__next__)
    future: RequestFuture = field(init=False, default_factory=RequestFuture)
    _token: list = field(init=False, default_factory=[True].copy, repr=False)  # pop(): atomic

    def claim(self) -> bool:
        """Take the one right to end the request: True for the one caller that gets it,
        who then reports its end and `settle`s it."""
        try:
            self._token.pop()
        except IndexError:
            return False
        return True

    def settle(self, outputs: dict[str, np.ndarray] | None, error: BaseException | None
               ) -> None:
        """Answer the claimed request's caller. A future already cancelled keeps its
        cancellation."""
        # The future holds this request (for its cancel hook): break that cycle, so the
        # pair is freed at once rather than left for the garbage collector.
        future = self.future
        future.request = None
        future.settle(outputs, error)  # False: cancelled while queued, which stands

    def start(self) -> bool:
        """Mark the future running; False if it was cancelled or the request has already
        ended (say, timed out between leaving its queue and starting)."""
        if not self._token:
            return False
        try:
            return self.future.set_running_or_notify_cancel()
        except RuntimeError:  # finished meanwhile
            return False

    @property
    def ended(self) -> bool:
        return not self._token


# a request (or a batch) ended: with its outputs, or an error; called once
RequestDone = Callable[[Request, Outputs | None, BaseException | None], None]


class RequestQueue:
    """Lower priority number first, FIFO among equals. Not thread-safe: the host locks.

    One line (a deque) per priority, in request id order: ids grow in arrival order, so
    an arrival is appended and the front is popped, each O(1) (a heap of tuples cost a
    batcher a comparison-heavy pop per member). A request taken out and pushed back
    (batching) goes back into its own place by id."""

    def __init__(self) -> None:
        self._lines: dict[int, deque[Request]] = {}
        self._gone: set[int] = set()  # ids discarded but still in a line
        self.size = 0  # requests waiting (what len() gives)

    def __len__(self) -> int:
        return self.size

    def push(self, request: Request) -> None:
        line = self._lines.get(request.priority)
        if line is None:
            line = self._lines[request.priority] = deque()
        if not line or request.id > line[-1].id:
            line.append(request)
        else:  # pushed back: into its place
            line.insert(bisect.bisect(line, request.id, key=attrgetter("id")), request)
        self.size += 1

    def discard(self, request: Request) -> bool:
        """Remove lazily; True if it was waiting here."""
        if request.id in self._gone or request not in self._lines.get(request.priority, ()):
            return False
        self._gone.add(request.id)
        self.size -= 1
        return True

    def oldest(self) -> Request | None:
        """The waiting request queued earliest (what a batch delay counts from): the
        earliest of each line's first."""
        firsts = (next((r for r in line if r.id not in self._gone), None)
                  for line in self._lines.values())
        return min((r for r in firsts if r is not None), key=attrgetter("queued_at"), default=None)

    def pop(self) -> Request | None:
        lines, gone = self._lines, self._gone
        while lines:
            priority = min(lines)
            line = lines[priority]
            request = line.popleft()
            if not line:
                del lines[priority]
            if gone and request.id in gone:
                gone.discard(request.id)
                continue
            self.size -= 1
            return request
        return None

    def drain(self) -> list[Request]:
        out = []
        while (request := self.pop()) is not None:
            out.append(request)
        return out
