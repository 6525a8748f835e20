"""A network as the host serves it: the loaded network, frozen, wrapped in the state its
requests change and the paths they take, all made once, when the network is added.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from runtime.executor.requests import Request
from runtime.host.batching import Batcher
from runtime.inputs import FeedCheck
from runtime.provision.network import LoadedNetwork

if TYPE_CHECKING:  # a bundle's host plans nothing: no graph, no partitioner imported
    from runtime.executor.futures import ReadyFuture
    from runtime.partition.plan import Plan
    from runtime.request_memory import RequestMemory

# A network's lean path: run(feeds, timeout, priority, rows) -> a finished future, or the
# feeds it checked, for the general path to take (runtime/host/lean.py).
LeanRun = Callable[[Mapping[str, object], "float | None", int, int], "ReadyFuture | dict"]


RUN_WEIGHT = 0.1  # each run's weight in the moving averages of its network's run time


class ServedNetwork:
    """`loaded` and its serving state. Requests read `name`, `specs`, `check_feeds`,
    `replicas`, `timeout`, `batcher` and `lean_run` (here: one attribute each on the hot
    path); `accepted`
    holds a token per request accepted and not yet ended (lean runs aside), `lean_runs` one
    per lean run in flight: deque appends and pops are atomic, so neither needs a lock.
    `removing` is set once `remove_network` begins; `running` holds requests started.
    `loaded` and `replicas` change only when the host's learner swaps in a re-made plan,
    under the dispatcher's lock (runtime/host/learning.py)."""

    __slots__ = ("accepted", "batcher", "check_feeds", "lean_run", "lean_runs", "loaded",
                 "memory", "name", "removing", "replicas", "run_seconds", "run_spread",
                 "running", "specs", "timeout")

    def __init__(self, loaded: LoadedNetwork, timeout: float,
                 batcher: Callable[[LoadedNetwork], Batcher],
                 lean_path: Callable[[ServedNetwork], LeanRun | None]):
        """`timeout`: a request's seconds when it names none (math.inf: none). `batcher`
        makes its batcher when it batches, `lean_path` its lean path if it has one."""
        self.loaded, self.name, self.timeout = loaded, loaded.name, timeout
        self.specs, self.replicas = loaded.specs, loaded.replicas
        self.memory: tuple[Plan, RequestMemory | None] | None = None  # made when first asked
        self.check_feeds = FeedCheck(loaded.name, loaded.specs, self.admit).check
        self.accepted: deque[None] = deque()
        self.lean_runs: deque[None] = deque()
        self.running: set[Request] = set()
        self.removing = False
        # moving averages of its queued requests' run (start to end) and of its deviation
        self.run_seconds = self.run_spread = 0.0
        self.batcher = batcher(loaded) if loaded.batching is not None else None
        self.lean_run = lean_path(self)

    def admit(self, shapes: dict[str, tuple[int, ...]]) -> bool:
        """Refuses feeds of shapes not seen before whose activations, over the partitions of
        the plan serving, need more than the machine's memory (a bundle's as it was
        compiled: its graph is loaded only when asked); True for outsized ones."""
        loaded = self.loaded
        if self.memory is None or self.memory[0] is not loaded.plan:
            self.memory = (loaded.plan, _request_memory(loaded))
        return self.memory[1] is not None and self.memory[1].admit(self.name, shapes)

    def ran(self, seconds: float) -> None:
        """A queued request ran `seconds`, start to end (under the dispatcher's lock)."""
        miss = seconds - self.run_seconds
        self.run_seconds += RUN_WEIGHT * miss
        self.run_spread += RUN_WEIGHT * (abs(miss) - self.run_spread)

    def hopeless(self, left: float) -> bool:
        """Too little time `left` to run: less than its runs take, plus twice their spread
        (most runs finish within that)."""
        return left < self.run_seconds + 2 * self.run_spread

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet ended, lean runs included."""
        return len(self.accepted) + len(self.lean_runs)


def _request_memory(loaded: LoadedNetwork) -> RequestMemory | None:
    if loaded.bundle is not None:
        return loaded.bundle.file.request_memory()
    graph = loaded.graph_source
    if graph is None or callable(graph):
        return None
    from runtime.partition.liveness import request_memory
    return request_memory(graph, [p.nodes for p in loaded.plan.partitions])
