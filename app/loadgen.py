"""Load generator: closed loop (N clients, each waits for its answer) or open loop
(Poisson arrivals at a rate), with random inputs of the right shape.

Used by `prism run`, `prism bench` and the dashboards, which pause, resume and change
the load while it runs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from runtime.errors import PrismError, QueueFullError
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds

OnResult = Callable[[dict, dict | None, BaseException | None, float], None]


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    rejected: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.ok + self.failed + self.rejected


class LoadGenerator:
    """Drive one network. Give `concurrency` (closed loop) or `rate` (open loop)."""

    def __init__(self, host: HostManager, network: str, *, concurrency: int | None = None,
                 rate: float | None = None, requests: int | None = None,
                 bindings: Mapping[str, int] | None = None, timeout: float | None = None,
                 feeds: Mapping[str, np.ndarray] | None = None, seed: int | None = None,
                 on_result: OnResult | None = None):
        if (concurrency is None) == (rate is None):
            raise PrismError("load: give either a concurrency or a rate")
        self.host, self.network = host, network
        self.concurrency, self.rate = concurrency, rate
        self.requests, self.timeout, self.on_result = requests, timeout, on_result
        self.specs = input_specs(host.graph(network))
        self.bindings = dict(bindings or {})
        self.fixed_feeds = dict(feeds) if feeds is not None else None
        self.rng = np.random.default_rng(seed)
        self.stats = LoadStats()
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._running.set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._outstanding: set[Future] = set()

    # -- controls ---------------------------------------------------------------------

    def start(self) -> LoadGenerator:
        if self.concurrency is None:
            self._threads = [threading.Thread(target=self._arrivals, name="prism-load",
                                              daemon=True)]
        else:
            self._threads = [self._client_thread(i) for i in range(self.concurrency)]
        for t in self._threads:
            t.start()
        return self

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def scale(self, factor: float) -> None:
        """Faster (>1) or slower (<1): scales the rate, or the client count in closed loop."""
        if self.rate is not None:
            self.rate = max(0.1, self.rate * factor)
        else:
            new = max(1, round(self.concurrency * factor))
            if new == self.concurrency and factor > 1:
                new += 1
            for i in range(self.concurrency, new):
                thread = self._client_thread(i)
                self._threads.append(thread)
                thread.start()
            self.concurrency = new  # clients above the count stop by themselves

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._running.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            pending = list(self._outstanding)
        for f in pending:  # open loop: wait (bounded) for answers in flight
            with contextlib.suppress(Exception):  # timed out or cancelled: counted elsewhere
                f.exception(timeout=max(0.0, deadline - time.monotonic()))

    def wait(self, timeout: float | None = None) -> bool:
        """Until the requested number of requests have ended (or `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.requests is None or self.stats.done < self.requests:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # -- loops -------------------------------------------------------------------------

    def _claim(self) -> dict | None:
        """Feeds for the next request, or None when the budget is spent or we stop."""
        self._running.wait()
        with self._lock:
            if self._stop.is_set() or (self.requests is not None and
                                       self.stats.sent >= self.requests):
                return None
            self.stats.sent += 1
            if self.fixed_feeds is not None:
                return self.fixed_feeds
            return random_feeds(self.specs, self.rng, self.bindings)

    def _client_thread(self, index: int) -> threading.Thread:
        return threading.Thread(target=self._client, args=(index,), name=f"prism-load-{index}",
                                daemon=True)

    def _client(self, index: int) -> None:
        while (feeds := self._claim()) is not None:
            start = time.perf_counter()
            try:
                outputs = self.host.run(self.network, feeds, timeout=self.timeout).result()
                self._record(feeds, outputs, None, start)
            except Exception as exc:
                self._record(feeds, None, exc, start)
            if self.concurrency is not None and index >= self.concurrency:
                return

    def _arrivals(self) -> None:
        next_at = time.perf_counter()
        while not self._stop.is_set():
            next_at += self.rng.exponential(1.0 / self.rate)
            delay = next_at - time.perf_counter()
            if delay > 0 and self._stop.wait(delay):
                return
            if self.paused:
                self._running.wait()
                next_at = time.perf_counter()
            feeds = self._claim()
            if feeds is None:
                return
            start = time.perf_counter()
            try:
                future = self.host.run(self.network, feeds, timeout=self.timeout)
            except Exception as exc:
                self._record(feeds, None, exc, start)
                continue
            with self._lock:
                self._outstanding.add(future)
            future.add_done_callback(lambda f, fd=feeds, s=start: self._landed(f, fd, s))

    def _landed(self, future: Future, feeds: dict, start: float) -> None:
        with self._lock:
            self._outstanding.discard(future)
        if future.cancelled():
            self._record(feeds, None, PrismError("cancelled"), start)
        elif future.exception() is not None:
            self._record(feeds, None, future.exception(), start)
        else:
            self._record(feeds, future.result(), None, start)

    def _record(self, feeds: dict, outputs: dict | None, error: BaseException | None,
                start: float) -> None:
        latency = time.perf_counter() - start
        with self._lock:
            if error is None:
                self.stats.ok += 1
                self.stats.latencies.append(latency)
            elif isinstance(error, QueueFullError):
                self.stats.rejected += 1
            else:
                self.stats.failed += 1
                self.stats.errors.append(str(error))
        if self.on_result is not None:
            self.on_result(feeds, outputs, error, latency)
