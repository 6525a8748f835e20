"""A first measured load checks its plan under load: each partition's median run time
while requests flow through the loaded plan, pipelined, as they will when it serves.

Timed alone, a partition's session runs faster than it does while the devices beside it
run theirs: after onnxruntime returns, its thread waits to retake the GIL from the other
devices' Python (the executor's hand-offs, the callers'), and the stages share the
machine's cores and memory. So when a network is measured for the first time, the host
sends a short burst of requests through the plan it loaded (`BURST_RUNS` runs of every
partition, `BURST_SECONDS` at most, `2 x` partitions in flight, feeds drawn as for
measuring), reads each partition's median run time from its `partition.run.finished`
events, scales its nodes to it (`measure.refined`) and plans again; a plan that changes
is loaded in place of the old and checked the same way (`ROUNDS` at most).

What a burst sees beyond the runtime's own cost is not the network's: on a machine other
work shares, a stage's thread may lose its core for half its runs, and that must not be
cached as the network's time. So a partition is taken to run under load at most
`LOAD_WAIT_MAX` (a GIL wait after each run: tens of microseconds, docs/performance.md)
or `LOAD_SHARE_MAX` of its time alone (shared caches and memory), whichever is more,
above what it ran alone (`bounded`); a burst that saw it run faster is believed.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runtime.executor.executor import Executor, LoadedPartition
from runtime.executor.requests import Request
from runtime.inputs import Signature

BURST_RUNS = 60  # runs of every partition
BURST_SECONDS = 2.0  # at most, however few runs that leaves
ROUNDS = 2  # plans checked under load, the first included
DRAIN_SECONDS = 10.0  # bound on waiting for the requests in flight at the end
LOAD_WAIT_MAX = 50e-6  # seconds a run may wait under load beyond its time alone...
LOAD_SHARE_MAX = 0.2  # ... or this share of it, whichever is more


def bounded(alone: float, loaded: float) -> float:
    """A partition's run time under load as the cost model takes it: what the burst saw,
    at most LOAD_WAIT_MAX or LOAD_SHARE_MAX more than its time alone."""
    return min(loaded, alone + max(LOAD_WAIT_MAX, LOAD_SHARE_MAX * alone))


def loaded_medians(network: str, replica: Sequence[LoadedPartition], face: Signature,
                   feeds: Mapping[str, np.ndarray], bus: Any) -> dict[str, float] | None:
    """Partition -> its median run time over a pipelined burst of requests through the
    loaded replica; None if a request failed (the feeds may not suit the network)."""
    events = bus.subscribe(maxlen=1_000_000, kinds=("partition.run.finished",))
    try:
        executor = Executor(face, replica, network, bus)
        if not _burst(executor, dict(feeds), 2 * len(replica)):
            return None
        runs: dict[str, list[float]] = {}
        for event in events.drain():
            if event.get("network") == network and event.get("ok"):
                runs.setdefault(event.get("partition"), []).append(event.get("run_seconds"))
    finally:
        events.close()
    if set(runs) != {lp.partition.name for lp in replica}:
        return None
    return {name: statistics.median(seconds) for name, seconds in runs.items()}


def _burst(executor: Executor, feeds: dict[str, np.ndarray], in_flight: int) -> bool:
    """Closed-loop requests until every partition ran BURST_RUNS times or BURST_SECONDS
    passed; False if one failed or they did not all end within DRAIN_SECONDS."""
    lock = threading.Lock()
    ended = threading.Event()
    state = {"sent": 0, "open": 0, "failed": False}
    stop_at = time.monotonic() + BURST_SECONDS

    def send() -> None:
        with lock:
            state["sent"] += 1
            state["open"] += 1
        executor.start(Request(executor.network, feeds, 0, None, time.monotonic()), landed)

    def landed(request: Request, outputs: object, error: BaseException | None) -> None:
        with lock:
            state["open"] -= 1
            state["failed"] = state["failed"] or error is not None
            more = (not state["failed"] and state["sent"] < BURST_RUNS
                    and time.monotonic() < stop_at)
            if not more and state["open"] == 0:
                ended.set()
        if more:
            send()

    for _ in range(min(in_flight, BURST_RUNS)):
        send()
    return ended.wait(BURST_SECONDS + DRAIN_SECONDS) and not state["failed"]
