"""Dynamic batching, with Triton's semantics.

Requests for one network wait in a priority queue of their own. A batch leaves when it
reaches `max_batch_size`, when a preferred size is reached (the largest one available),
or when the oldest waiting request has waited `max_queue_delay_ms`, and a place among
the host's `max_active` is free. Only requests whose inputs agree in everything but the
first (batch) dimension go together. Inputs are concatenated on that dimension, the
network runs once, and each output is split back to its request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from runtime.errors import PrismError
from runtime.graph import Graph
from runtime.requests import Request, RequestQueue


@dataclass(frozen=True)
class BatchingConfig:
    max_batch_size: int = 8
    max_queue_delay_ms: float = 1.0
    preferred_batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_queue_delay_ms < 0:
            raise PrismError(f"batching needs max_batch_size >= 1 and max_queue_delay_ms >= "
                             f"0, got {self.max_batch_size} and {self.max_queue_delay_ms}")
        object.__setattr__(self, "preferred_batch_sizes", tuple(sorted(
            {int(s) for s in self.preferred_batch_sizes if 0 < int(s) <= self.max_batch_size})))

    @classmethod
    def of(cls, value: BatchingConfig | Mapping | None) -> BatchingConfig | None:
        if value is None or isinstance(value, BatchingConfig):
            return value
        unknown = set(value) - {"max_batch_size", "max_queue_delay_ms", "preferred_batch_sizes"}
        if unknown:
            raise PrismError(f"batching: unknown setting(s) {sorted(unknown)}")
        return cls(**value)


def check_batchable(graph: Graph) -> None:
    """Every input and output must have a symbolic first dimension, or batching is refused."""
    for kind, names in (("input", graph.inputs), ("output", graph.outputs)):
        for name in names:
            dims = graph.tensors[name].dims if name in graph.tensors else None
            if not dims or isinstance(dims[0], int):
                first = "no shape" if not dims else f"a fixed first dimension {dims[0]}"
                raise PrismError(f"{graph.name} cannot batch: {kind} {name!r} has {first}; "
                                 f"dynamic batching needs a symbolic batch dimension")


def rows(request: Request) -> int:
    """A request's share of a batch: its first dimension."""
    return len(next(iter(request.feeds.values()))) if request.feeds else 1


def signature(feeds: Mapping[str, np.ndarray]) -> tuple:
    """What must agree for requests to share a batch: all but the first dimension."""
    return tuple((k, v.dtype.str, v.shape[1:]) for k, v in sorted(feeds.items()))


def concatenate(members: list[Request]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([m.feeds[name] for m in members])
            for name in members[0].feeds}


def split(outputs: Mapping[str, np.ndarray], members: list[Request]) -> list[dict]:
    sizes = np.cumsum([len(next(iter(m.feeds.values()))) for m in members])[:-1]
    parts = {name: np.split(value, sizes) for name, value in outputs.items()}
    return [{name: parts[name][i] for name in outputs} for i in range(len(members))]


class Batcher:
    """Gathers one network's requests; `launch` runs a batch once a place is free."""

    def __init__(self, name: str, config: BatchingConfig, take_place: Callable[[], bool],
                 give_back: Callable[[], None], launch: Callable[[list[Request]], None],
                 failed: Callable[[list[Request], BaseException], None]):
        self.name, self.config = name, config
        self._take_place, self._give_back, self._launch = take_place, give_back, launch
        self._failed = failed
        self._queue = RequestQueue()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"prism-batch-{name}",
                                        daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        return self._queue.size

    def push(self, request: Request) -> None:
        with self._cv:
            self._queue.push(request)
            size, cfg = self._queue.size, self.config
            # Wake the batcher only when it has something to do: start the delay clock,
            # or send a full (or preferred) batch. Waking it for every request steals
            # the interpreter from whoever is sending them.
            if size == 1 or size >= cfg.max_batch_size or size in cfg.preferred_batch_sizes:
                self._cv.notify()

    def discard(self, request: Request) -> None:
        with self._cv:
            self._queue.discard(request)

    def place_freed(self) -> None:
        with self._cv:
            self._cv.notify()

    def _ready(self, now: float) -> bool:
        size, cfg = self._queue.size, self.config
        if size >= cfg.max_batch_size or (cfg.preferred_batch_sizes and
                                          size >= cfg.preferred_batch_sizes[0]):
            return True
        oldest = self._queue.oldest()
        return oldest is not None and now - oldest.queued_at >= cfg.max_queue_delay_ms / 1e3

    def _form(self) -> list[Request]:
        """Up to max_batch_size requests like the first in priority order (a preferred
        size when one fits), leaving the rest queued in their order."""
        waiting = self._queue.drain()
        waiting = [r for r in waiting if not r.ended]
        if not waiting:
            return []
        key = signature(waiting[0].feeds)
        alike, total = [], 0
        for r in waiting:  # in priority order; rows, not requests, count against the maximum
            if signature(r.feeds) != key:
                continue
            if alike and total + rows(r) > self.config.max_batch_size:
                break  # never let a later request jump one that does not fit
            alike.append(r)
            total += rows(r)
        fitting = [s for s in self.config.preferred_batch_sizes if s <= total]
        if fitting and total < self.config.max_batch_size:
            while total > fitting[-1] and len(alike) > 1:
                total -= rows(alike.pop())
        chosen = set(map(id, alike))
        for r in waiting:
            if id(r) not in chosen:
                self._queue.push(r)
        return alike

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed:
                    now = time.monotonic()
                    if self._queue.size and self._ready(now) and self._take_place():
                        batch = self._form()
                        break
                    oldest = self._queue.oldest()
                    if oldest is None or self._ready(now):
                        wait = 0.05  # nothing queued, or ready but no place: until notified
                    else:
                        wait = oldest.queued_at + self.config.max_queue_delay_ms / 1e3 - now
                    self._cv.wait(min(max(wait, 1e-4), 0.05))
                else:
                    return
            if not batch:  # everything waiting had ended meanwhile
                self._give_back()
                continue
            try:
                self._launch(batch)
            except Exception as exc:  # the batcher must outlive any one batch
                self._failed(batch, exc)

    def close(self, timeout: float = 2.0) -> list[Request]:
        """Stop; returns the requests still waiting."""
        with self._cv:
            self._closed = True
            left = self._queue.drain()
            self._cv.notify()
        self._thread.join(timeout)
        return left
