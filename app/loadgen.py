"""Load generator: closed loop (N clients, each waits for its answer) or open loop
(Poisson arrivals at a rate), with random inputs of the right shape.

A closed-loop client is a chain of callbacks, not a thread: when its answer arrives it
sends its next request, so exactly N are outstanding, as with Triton's perf_analyzer.
Blocked client threads would each pay a wake-up and a GIL hand-off per request, and
the generator would end up measuring itself.

Used by `prism run`, `prism bench` and the dashboards, which pause, resume and change
the load while it runs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from runtime.devices.ort.sessions import cpu_session
from runtime.errors import PrismError, QueueFullError
from runtime.graph import Graph
from runtime.host import HostManager
from runtime.inputs import InputSpec, input_specs, random_feeds, shapes_text

POOL = 64  # distinct random feed sets per generator
POOL_BYTES = 256 << 20  # ... fewer when they are large: the pool never holds more than this
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


def feed_pool(specs: list[InputSpec], rng: np.random.Generator,
              bindings: Mapping[str, int] | None) -> list[dict]:
    """Up to POOL random feed sets, within POOL_BYTES (always at least one)."""
    pool = [random_feeds(specs, rng, bindings)]
    size = sum(np.asarray(v).nbytes for v in pool[0].values() if isinstance(v, np.ndarray))
    more = min(POOL, POOL_BYTES // max(size, 1)) - 1
    return pool + [random_feeds(specs, rng, bindings) for _ in range(more)]


GIVE_INPUTS = "--inputs FILE.npz, or sizes with --bind DIM=N"  # the flags that give them


def made_up_hint(feeds: dict, how: str = GIVE_INPUTS) -> str:
    """Where every request failed on made-up inputs, which ones and how to give others
    (`how`: a command's flags): a model may take only some sizes (PP-OCR's recognizer,
    text lines 48 high) or values (silero's VAD, a sample rate of 8000 or 16000)."""
    shown = shapes_text({k: getattr(v, "shape", ()) for k, v in feeds.items()})
    return f" (on made-up inputs: {shown}; give yours with {how})"


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
        self.specs = host.inputs(network)
        self.bindings = dict(bindings or {})
        self.made_up = feeds is None
        self.rng = np.random.default_rng(seed)
        # A pool drawn once per run: drawing per request would cost more than a small
        # network's run, and the generator would measure itself. Given feeds are the pool.
        self.pool = feed_pool(self.specs, self.rng, self.bindings) if feeds is None else \
            [dict(feeds)]
        self.stats = LoadStats()
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._running.set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._outstanding: set[Future] = set()  # open loop: answers to wait for at stop
        self._sender: int | None = None  # the sending thread's ident
        self._idle: list[int] = []  # closed-loop clients parked by pause()
        self._active: set[int] = set()  # closed-loop clients whose chain is running
        self._ready: deque[int] = deque()  # closed-loop clients to send for now
        self._ready_cv = threading.Condition()

    # -- controls ---------------------------------------------------------------------

    def start(self) -> LoadGenerator:
        target = self._arrivals if self.concurrency is None else self._serve_ready
        self._threads = [threading.Thread(target=target, name="prism-load", daemon=True)]
        if self.concurrency is not None:
            self._active.update(range(self.concurrency))
            self._wake(range(self.concurrency))
        self._threads[0].start()
        return self

    def _wake(self, clients) -> None:
        with self._ready_cv:
            self._ready.extend(clients)
            self._ready_cv.notify()

    def _retire(self, client: int) -> None:
        with self._lock:
            self._active.discard(client)

    def _serve_ready(self) -> None:
        """Closed loop: send for clients whose answer came at once (or who just started),
        round robin; answers that take time continue their chain from the callback."""
        self._sender = threading.get_ident()
        while not self._stop.is_set():
            with self._ready_cv:
                while not self._ready and not self._stop.is_set():
                    self._ready_cv.wait(0.1)
                if self._stop.is_set():
                    return
                client = self._ready.popleft()
            self._send(client)

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()
        with self._lock:
            idle, self._idle = self._idle, []
        self._wake(idle)

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def scale(self, factor: float) -> None:
        """Faster (>1) or slower (<1): scales the rate, or the client count in closed loop."""
        if self.rate is not None:
            self.rate = max(0.1, self.rate * factor)
        elif self.concurrency is not None:
            new = max(1, round(self.concurrency * factor))
            if new == self.concurrency and factor > 1:
                new += 1
            self.concurrency = new  # clients above it stop after their answer
            with self._lock:
                fresh = [c for c in range(new) if c not in self._active]
                self._active.update(fresh)
            self._wake(fresh)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._running.set()
        with self._ready_cv:
            self._ready_cv.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            pending = list(self._outstanding)
        for f in pending:  # open loop: wait (bounded) for answers in flight
            with contextlib.suppress(Exception):  # timed out or cancelled: counted elsewhere
                f.exception(timeout=max(0.0, deadline - time.monotonic()))

    def measure(self, timeout: float = 600.0) -> float:
        """Run the request budget to the end; requests answered per second. Any failure
        is an error: a throughput with failures in it would flatter the runtime."""
        start = time.perf_counter()
        self.start().wait(timeout)
        wall = time.perf_counter() - start
        self.stop()
        if self.stats.failed:
            raise PrismError(f"{self.stats.failed} requests failed: {self.stats.errors[0]}"
                             f"{self.hint()}")
        return self.stats.ok / wall

    def hint(self, how: str = GIVE_INPUTS, share: float = 1.0) -> str:
        """`made_up_hint` where every request (or `share` of them) failed on made-up
        inputs, else ""."""
        failing = self.stats.failed >= share * self.stats.done > 0
        return made_up_hint(self.pool[0], how) if self.made_up and failing else ""

    def wait(self, timeout: float | None = None) -> bool:
        """Until the requested number of requests have ended (or `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.requests is None or self.stats.done < self.requests:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # -- loops -------------------------------------------------------------------------

    def _claim(self, wait: bool = True) -> dict | None:
        """Feeds for the next request, or None when the budget is spent or we stop."""
        if wait:
            self._running.wait()
        with self._lock:
            if self._stop.is_set() or (self.requests is not None and
                                       self.stats.sent >= self.requests):
                return None
            self.stats.sent += 1
            return self.pool[self.stats.sent % len(self.pool)]

    def _send(self, client: int) -> None:
        """Send client's next request. An answer that is there at once (the device was
        idle and ran it on this thread) puts the client back in the ready queue."""
        if client >= (self.concurrency or 0) or self._stop.is_set():
            self._retire(client)
            return
        if self.paused:
            with self._lock:
                self._idle.append(client)
            return
        feeds = self._claim(wait=False)
        if feeds is None:
            self._retire(client)
            return
        start = time.perf_counter()
        try:
            future = self.host.run(self.network, feeds, timeout=self.timeout, inline=False)
        except Exception as exc:
            self._record(feeds, None, exc, start)
            self._wake([client])
            return
        future.add_done_callback(partial(self._answered, client, feeds, start))

    def _answered(self, client: int, feeds: dict, start: float, future: Future) -> None:
        self._settle(future, feeds, start)
        if threading.get_ident() == self._sender:
            self._wake([client])  # answered at once on our own thread: no recursion
        else:
            self._send(client)

    def _arrivals(self) -> None:
        next_at = time.perf_counter()
        while not self._stop.is_set():
            next_at += self.rng.exponential(1.0 / (self.rate or 1.0))  # open loop: set
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
                future = self.host.run(self.network, feeds, timeout=self.timeout,
                                       inline=False)
            except Exception as exc:
                self._record(feeds, None, exc, start)
                continue
            with self._lock:
                self._outstanding.add(future)
            future.add_done_callback(partial(self._landed, feeds, start))

    def _landed(self, feeds: dict, start: float, future: Future) -> None:
        with self._lock:
            self._outstanding.discard(future)
        self._settle(future, feeds, start)

    def _settle(self, future: Future, feeds: dict, start: float) -> None:
        try:
            outputs = future.result(0)
        except CancelledError:
            self._record(feeds, None, PrismError("cancelled"), start)
        except Exception as exc:
            self._record(feeds, None, exc, start)
        else:
            self._record(feeds, outputs, None, start)

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


def plain_onnxruntime(graph: Graph, clients: int, requests: int, threads: int = 1,
                      bindings: Mapping[str, int] | None = None, feeds: dict | None = None
                      ) -> tuple[float, list[float]]:
    """The baseline: one plain onnxruntime session on the whole model, fed by `clients`
    threads (onnxruntime releases the GIL while it runs) `feeds` or random ones. Returns
    (requests/s, latencies)."""
    session = cpu_session(graph.model, threads=threads, stamp=True)
    pool = [feeds] if feeds is not None else feed_pool(input_specs(graph),
                                                        np.random.default_rng(), bindings)
    count = iter(range(requests))
    latencies: list[float] = []

    def client() -> None:
        for i in count:
            start = time.perf_counter()
            session.run(None, pool[i % len(pool)])
            latencies.append(time.perf_counter() - start)

    workers = [threading.Thread(target=client, name=f"prism-plain-{i}") for i in range(clients)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return requests / (time.perf_counter() - start), latencies
