"""What runs inside a `ray` device's actor process: onnxruntime sessions, one per loaded
partition, run one at a time in arrival order.

Plain Python: `device.py` wraps the class with `ray.remote` when it starts an actor,
so this module imports no Ray, and like the standalone driver only numpy, onnxruntime,
the session options every cpu partition runs under, the modelled clock and the heap's
trim (`runtime.heap`, ctypes alone): a worker process starts in well under a second.
Expected failures come back as a message (the first of `run`'s returns), never as an
exception: Ray would print its traceback, and the device names the device and partition
itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from runtime.devices.ort.options import ArenaDebt, new_session, refuse_empty
from runtime.devices.timeline import Timeline
from runtime.errors import first_line
from runtime.heap import give_back
from runtime.types import OutsizedFeeds

# (error message or None, the run's seconds, each output's dtype and shape or None)
Status = tuple[str | None, float, list[tuple[str, tuple[int, ...]] | None]]


class PartitionWorker:
    def __init__(self, device: str, threads: int, timed: bool, spin: bool = True):
        self.device, self.threads, self.timed, self.spin = device, threads, timed, spin
        # key -> (session, output names, modelled seconds of one run, `refuse_empty`'s check,
        # its arena's debt)
        self.sessions: dict[str, tuple[ort.InferenceSession, list[str], float, Any,
                                       ArenaDebt]] = {}
        self.timeline = Timeline()

    def info(self) -> dict[str, Any]:
        """Where this actor runs: node address and id, process id."""
        import ray  # inside an actor Ray is loaded already

        return {"node": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def load(self, key: str, model: bytes, seconds: float, ops: Iterable[str] = (),
             external: Mapping[str, np.ndarray] | None = None, half: bool = False
             ) -> tuple[str | None, list[str]]:
        """(None, output names), or (why not, []). `ops`: the model's op types; `external`:
        the files it names as external data, in memory (`Program.external`); `half`:
        `Program.half`."""
        try:
            session = new_session(model, self.threads, external, half, spin=self.spin)
        except Exception as exc:
            return (f"{self.device}: onnxruntime cannot load {key}: {first_line(exc)}", [])
        names = [o.name for o in session.get_outputs()]
        self.sessions[key] = (session, names, max(0.0, seconds), refuse_empty(ops),
                              ArenaDebt())
        give_back()  # what making the session freed (its copies of the weights)
        return None, names

    def unload(self, key: str) -> None:
        self.sessions.pop(key, None)
        give_back()

    def held(self) -> list[str]:
        """The keys loaded here (what a removed network must no longer hold)."""
        return list(self.sessions)

    def ping(self) -> None:
        """Answered in turn: the device's proof of life when it has nothing to run."""

    def run(self, key: str, width: int, sent_at: float, feeds: dict[str, np.ndarray],
            names: tuple[str, ...], *fetched: np.ndarray) -> tuple:
        """Status, then `width` values, one per output. `fetched` are the tensors that came as
        object references (Ray resolved them before this call), named by `names`;
        `sent_at` is the host's wall clock when it sent the call, so a `sim` actor's run
        starts when it arrived, as on a command queue (never later than now: clocks of
        two nodes may disagree)."""
        arrived = time.perf_counter() - max(0.0, time.time() - sent_at)
        entry = self.sessions.get(key)
        if entry is None:
            return (f"{self.device}: {key} is not loaded", 0.0, []), *([None] * width)
        session, outputs, seconds, check, arena = entry
        start = time.perf_counter()
        try:
            given = {**feeds, **dict(zip(names, fetched, strict=True))}
            if check is not None:
                check(given)
            values = arena.run(session.run, outputs, given, type(feeds) is OutsizedFeeds)
        except Exception as exc:
            return ((f"{self.device} failed running {key}: {first_line(exc)}", 0.0, []),
                    *([None] * width))
        if self.timed:
            self.timeline.hold(arrived, seconds)
        kinds = [(v.dtype.str, v.shape) if isinstance(v, np.ndarray) else None for v in values]
        return (None, time.perf_counter() - start, kinds), *values
