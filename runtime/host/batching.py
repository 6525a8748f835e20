"""Dynamic batching, with Triton's semantics.

Requests for one network wait in a priority queue of their own. A batch leaves when it
reaches `max_batch_size`, when a preferred size is reached (the largest one available),
or when the oldest waiting request has waited `max_queue_delay_ms`, and one of the host's
`max_active` slots is free. The delay counts from the oldest request's arrival or from
when the batcher was last free (done launching or answering a batch), whichever is
later: Triton's scheduler answers on other threads, and this one's answering time is
not a wait for more requests. Only requests whose inputs agree in everything but the first
(batch) dimension go together. Inputs are concatenated on that dimension, the network
runs once, and each output is split back to its request (`split`, where the host ends
requests).

A batch is a Request of its own holding the slot, with its live requests as `members`.
Everything a batcher does happens on its thread: forming and launching batches, and
answering finished ones (`_finished`), so its count of batches in flight needs no lock.

A batch whose run fails does not fail its members: they go back to the front of the
queue, each to run once more in a batch of its own, so only a request that fails alone
fails, with its own error. Batching stays invisible to a request's outcome, as Triton's
users expect of it; the cost is paid on failure only (one run per member).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from runtime.errors import (
    ExecutionError,
    HostClosedError,
    InvalidInputError,
    QueueFullError,
)
from runtime.executor.requests import Request, RequestDone, RequestQueue
from runtime.inputs import InputSpec
from runtime.types import BatchingConfig, OutsizedFeeds


def alike_but_first(specs: Sequence[InputSpec]) -> bool:
    """Do checked feeds always agree in all but their first dimension (every input a
    tensor of one dtype with its other dimensions fixed)? Then any requests share a batch
    and nobody need compare them."""
    return all(s.type is None and s.dtype is not None and s.dims is not None
               and all(isinstance(d, int) for d in s.dims[1:]) for s in specs)


def batch_key(feeds: Mapping[str, np.ndarray]) -> tuple:
    """What must agree for requests to share a batch: every input's dtype and all but its
    first dimension. Feeds come checked, in the network's input order."""
    if len(feeds) == 1:  # the usual case, without a generator
        (value,) = feeds.values()
        return value.dtype, value.shape[1:]
    return tuple((v.dtype, v.shape[1:]) for v in feeds.values())


def concatenate(members: list[Request]) -> dict[str, np.ndarray]:
    """The members' feeds as one batch's, outsized if any member's is."""
    feeds = {name: np.concatenate([m.feeds[name] for m in members]) for name in members[0].feeds}
    return OutsizedFeeds(feeds) if any(type(m.feeds) is OutsizedFeeds for m in members) \
        else feeds


def split(outputs: Mapping[str, np.ndarray], members: list[Request]) -> list[dict]:
    """Each member's rows of every output (a list, a ZipMap's maps, sliced alike)."""
    if len(outputs) == 1 and all(m.rows == 1 for m in members):  # the usual case, fast
        ((name, value),) = outputs.items()
        if type(value) is np.ndarray:
            return [{name: row} for row in value[:, None]]  # views, made in C: half the time
    parts, start = [], 0
    for m in members:
        end = start + m.rows
        parts.append({name: value[start:end] for name, value in outputs.items()})
        start = end
    return parts


def _rows_problem(batch: Request, outputs: Mapping[str, np.ndarray]) -> ExecutionError | None:
    """Each output must have a row per row fed (an array, or a list of a row's maps), or
    splitting it back would be wrong, or fail with its members never answered."""
    for name, value in outputs.items():
        rows = len(value) if type(value) is list or (
            type(value) is np.ndarray and value.ndim) else None
        if rows != batch.rows:
            return ExecutionError(f"a batch of {batch.rows} rows to {batch.network} came "
                                  f"back with {'no' if rows is None else rows} rows of {name!r}")
    return None


class Batcher:
    """Gathers one network's requests and runs them in batches.

    Its host lends it: `take_slot()` (one of the host's slots, or False), `begin(batch,
    done)` (run a batch on a replica; `done` when it ends) and `finish(request, outputs,
    error)` (the host's one place where requests end; for a batch, each member with its
    rows). Up to `in_flight` batches run at once, two per stage: one running and one
    queued on the device, so the device never waits for the batcher."""

    def __init__(self, name: str, config: BatchingConfig, in_flight: int, *,
                 take_slot: Callable[[], bool], begin: Callable[[Request, RequestDone], None],
                 finish: RequestDone, bus: Any = None, uniform: bool = False):
        self.name, self.config, self.bus = name, config, bus
        self._uniform = uniform  # feeds always agree but in the first dimension: one key
        self._take_slot, self._begin, self._finish = take_slot, begin, finish
        self._limit, self._in_flight = in_flight, 0
        self._free_since = 0.0  # when this thread last finished launching or answering
        self._queue = RequestQueue()
        self._lock = threading.Lock()  # taken bare where nothing waits: cheaper than `_cv`'s
        self._cv = threading.Condition(self._lock)
        self._closed = False
        self._completions: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._loop, name=f"prism-batch-{name}",
                                        daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        return self._queue.size

    def push(self, request: Request, limit: int | None = None) -> int:
        """Queue `request`, its rows counted (its first dimension, its share of a batch);
        returns how many wait now. InvalidInputError for more rows than a batch holds,
        HostClosedError once closed, QueueFullError when `limit` wait already. (What
        else must agree for requests to share a batch is the batcher thread's to work
        out: the less a sender's thread does, the more senders make each batch.)"""
        feeds, cfg = request.feeds, self.config
        rows = request.rows = len(next(iter(feeds.values()))) if feeds else 1
        if len(feeds) > 1 and any(len(value) != rows for value in feeds.values()):
            sizes = ", ".join(f"{name!r}: {len(value)}" for name, value in feeds.items())
            raise InvalidInputError(f"request to {self.name} has inputs of different batch "
                                    f"sizes ({sizes}); a batch joins them row by row")
        if rows > cfg.max_batch_size:
            raise InvalidInputError(f"request to {self.name} has batch {rows}, more than "
                                    f"its max_batch_size {cfg.max_batch_size}")
        with self._lock:
            queue = self._queue
            if self._closed:
                raise HostClosedError("host is closed; it takes no more requests")
            if limit is not None and queue.size >= limit:
                raise QueueFullError.at(limit)
            queue.push(request)
            size = queue.size
            # Wake the batcher only when it has something to do: start the delay clock,
            # or send a full (or preferred) batch. Waking it for every request steals
            # the interpreter from whoever is sending them.
            if size == 1 or size >= cfg.max_batch_size or size in cfg.preferred_batch_sizes:
                self._cv.notify()
        return size

    def discard(self, request: Request) -> None:
        with self._cv:
            self._queue.discard(request)

    def slot_freed(self) -> None:
        with self._cv:
            self._cv.notify()

    def _due(self) -> float | None:
        """When the batch waiting now must leave, full or not: `max_queue_delay_ms` after
        its oldest request came, or after this thread was last free to send it, whichever
        is later (None: nothing waits). Time spent answering the last batch is this
        thread's, not a wait for more requests: counted, it would send the next batch with
        only those answered first (Triton's scheduler answers on other threads)."""
        oldest = self._queue.oldest()
        if oldest is None:
            return None
        return max(oldest.queued_at, self._free_since) + self.config.max_queue_delay_ms / 1e3

    def _ready(self, now: float, due: float | None) -> bool:
        """A batch may leave now (`due`: from `_due`, which walks the queue once)."""
        size, cfg = self._queue.size, self.config
        if size >= cfg.max_batch_size or (cfg.preferred_batch_sizes and
                                          size >= cfg.preferred_batch_sizes[0]):
            return True
        return due is not None and now >= due

    def _form(self) -> list[Request]:
        """Up to max_batch_size rows of requests like the first in priority order (a
        preferred size when one fits); the rest stay queued in their places."""
        limit = self.config.max_batch_size
        alike: list[Request] = []
        passed: list[Request] = []
        total = 0
        while total < limit and (r := self._queue.pop()) is not None:
            if r.ended:
                continue
            if not r.key and not self._uniform:  # uniform: every key stays ()
                r.key = batch_key(r.feeds)
            if alike and (r.key != alike[0].key or r.alone):
                passed.append(r)  # another shape, or one to try alone: a later batch
                continue
            if total + r.rows > limit:
                passed.append(r)
                break  # never let a later request jump one that does not fit
            alike.append(r)
            total += r.rows
            if r.alone:
                break
        fitting = [s for s in self.config.preferred_batch_sizes if s <= total]
        if fitting and total < limit:
            while total > fitting[-1] and len(alike) > 1:
                passed.append(alike.pop())
                total -= passed[-1].rows
        for r in passed:
            self._queue.push(r)  # back in its place: the queue orders by request id
        return alike

    def _launch(self, formed: list[Request]) -> None:
        """Start the members still waiting, concatenate, run once (batcher's thread)."""
        batch = Request(self.name, {}, slot=True, members=[])
        try:
            # started: a deadline finds it running (one tried alone was started before)
            now, live, rows, oldest, size = time.monotonic(), [], 0, math.inf, len(formed)
            for m in formed:  # one pass: each member is a cache miss on this thread
                if m.alone or m.start():
                    live.append(m)
                    rows += m.rows
                    m.batch_size = size
                    if not m.alone:
                        m.started_at = now
                    if m.queued_at < oldest:
                        oldest = m.queued_at
            if live:
                if len(live) < size:  # some had ended meanwhile
                    size = len(live)
                    for m in live:
                        m.batch_size = size
                if self.bus is not None and self.bus.active:
                    for m in live:
                        if not m.alone:
                            self.bus.publish("request.started", network=self.name, request=m.id,
                                             queue_wait=now - m.queued_at, batch_size=size)
                batch.members, batch.batch_size, batch.started_at = live, size, now
                batch.queued_at = oldest
                batch.rows, batch.feeds = rows, concatenate(live)
                self._begin(batch, self._finished)
                return
        # The batcher must outlive any one batch, also an interrupt-like BaseException out
        # of a run on its own thread (its batch has ended by then): it was meant for a
        # caller's thread, and this is none.
        except BaseException as exc:
            self._done(batch, None, exc)
            return
        self._done(batch, None, None)  # everything formed had ended: the slot goes back

    def _finished(self, batch: Request, outputs: dict | None, error: BaseException | None
                  ) -> None:
        """A batch's run ended (on a device's thread): answer it on the batcher's thread,
        so the device goes straight on to the next batch. One hand-off per batch (none when
        it ran on the batcher's thread)."""
        if threading.current_thread() is self._thread:
            self._done(batch, outputs, error)
            return
        with self._cv:
            self._completions.append(partial(self._done, batch, outputs, error))
            self._cv.notify()

    def _done(self, batch: Request, outputs: dict | None, error: BaseException | None) -> None:
        if batch.ended:  # only this thread ends batches
            return
        self._in_flight -= 1
        if outputs is not None and error is None:
            error = _rows_problem(batch, outputs)
        if isinstance(error, ExecutionError) and self._alone(batch, error):
            return
        self._finish(batch, None if error else outputs, error)

    def _alone(self, batch: Request, error: ExecutionError) -> bool:
        """A batch of several failed running: its live members go back to the front of the
        queue (their places: the queue orders by request id) to run once more, alone.
        The batch ends without them, giving its slot back."""
        live = [m for m in batch.members or () if not m.ended]
        if batch.batch_size < 2 or not live:
            return False
        with self._cv:
            if self._closed:
                return False
            for m in live:
                m.alone = True
                self._queue.push(m)
            self._cv.notify()
        batch.members = []  # they carry on: ending the batch ends none of them
        self._finish(batch, None, error)
        return True

    def _loop(self) -> None:
        while True:
            formed: list[Request] | None = None
            completion = None
            with self._cv:
                while True:
                    now, due = time.monotonic(), self._due()
                    ready = self._ready(now, due)
                    # A ready batch goes first: the requests a finished batch sent again
                    # should run before the next finished batch is answered.
                    if (not self._closed and self._queue.size and ready
                            and self._in_flight < self._limit and self._take_slot()):
                        self._in_flight += 1
                        formed = self._form()
                        break
                    if self._completions:
                        completion = self._completions.pop(0)
                        break
                    if self._closed:
                        return
                    # nothing queued, or ready but no slot: until notified
                    wait = 0.05 if due is None or ready else due - now
                    self._cv.wait(min(max(wait, 1e-4), 0.05))
            if completion is not None:
                completion()
            elif formed is not None:
                self._launch(formed)
            self._free_since = time.monotonic()

    def close(self, timeout: float = 2.0) -> list[Request]:
        """Stop; returns the requests still waiting."""
        with self._cv:
            self._closed = True
            left = self._queue.drain()
            self._cv.notify()
        self._thread.join(timeout)
        return left
