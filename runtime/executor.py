"""Executor: runs requests over one replica of a plan (its partitions, loaded once).

`start(request, done)` is the way every request runs, a batch included. A partition
starts on its device as soon as every tensor it reads exists; its outputs may start
children. The first stage of a request that may run inline (`request.inline`) runs on
the caller's thread when its device is idle (for a one-partition plan, that is the whole
request); every later stage queues on its device's own thread, so a caller sending many
requests gets them pipelined: different requests' stages overlap on different devices.
Tensors stay in host memory and pass by reference; the plan's transfers model what a
real copy would cost (and `sim` devices are held for it). The first error wins and ends
the request; its other partitions are abandoned.

`run_now(feeds)` is the lean path the host takes with no Request record at all (one
partition, nobody listening, no timeout): the device's `run_now`, or None when it is busy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
from onnx import numpy_helper

from runtime.devices.device import Outputs, Tag
from runtime.devices.remote import local
from runtime.errors import ExecutionError
from runtime.graph import Graph
from runtime.provision import LoadedPartition
from runtime.requests import Request

Done = Callable[[Request, Outputs | None, BaseException | None], None]


class _Run:
    """One request in flight: the tensors it has, and the inputs each partition lacks."""

    __slots__ = ("failed", "landed", "lock", "missing", "values")

    def __init__(self, values: dict[str, np.ndarray], missing: list[int]):
        self.values, self.missing = values, missing
        self.landed = 0
        self.failed = False
        self.lock = threading.Lock()


class Executor:
    def __init__(self, graph: Graph, loaded: Sequence[LoadedPartition], network: str,
                 bus: Any = None):
        self.network, self.parts, self.bus = network, list(loaded), bus
        self.outputs = list(graph.outputs)
        self.constants = {t: numpy_helper.to_array(graph.initializers[t])
                          for t in self.outputs if t in graph.initializers}
        fed = set(graph.inputs)
        self.readers: dict[str, list[int]] = {}
        self.missing: list[int] = []
        for i, lp in enumerate(loaded):
            inputs = dict.fromkeys(lp.partition.inputs)
            for t in inputs:
                self.readers.setdefault(t, []).append(i)
            self.missing.append(sum(t not in fed for t in inputs))
        # a device that leaves tensors in another process: fetch them where they must be here
        self.remote = any(lp.device.takes_remote for lp in self.parts)
        self.outstanding = 0  # requests in flight on this replica; the host balances on it
        self.last_used = 0
        # The lean path hands over the feeds as given and returns the outputs: only when
        # the one partition reads exactly the graph inputs and makes every graph output.
        self.single = len(self.parts) == 1 and not self.constants and set(
            self.parts[0].partition.inputs) == fed and set(self.outputs) <= set(
            self.parts[0].partition.outputs)
        self._reorder = self.single and list(self.parts[0].partition.outputs) != self.outputs

    def run_now(self, feeds: dict[str, np.ndarray]) -> Outputs | None:
        """A `single` plan on this thread: the graph outputs, or None if its device is busy.
        Raises ExecutionError naming the partition and the device."""
        lp = self.parts[0]
        try:
            outputs = lp.device.run_now(lp.key, feeds)
        except ExecutionError as exc:
            _named(exc, lp)
            raise
        if outputs is None or not self._reorder:
            return outputs
        return {t: outputs[t] for t in self.outputs}

    def start(self, request: Request, done: Done) -> None:
        """Run `request`; `done(request, outputs, error)` is called once when it ends."""
        run = _Run({**request.feeds, **self.constants}, list(self.missing))
        if not self.parts:
            done(request, {t: run.values[t] for t in self.outputs}, None)
            return
        # Collect first: a partition that runs inline may make others ready meanwhile.
        for i in [i for i, count in enumerate(run.missing) if count == 0]:
            self._launch(run, request, i, done)

    def _tag(self, request: Request, lp: LoadedPartition) -> Tag | None:
        if self.bus is None or not self.bus.active:
            return None
        return {"network": self.network, "request": request.id, "partition": lp.partition.name}

    def _launch(self, run: _Run, request: Request, i: int, done: Done) -> None:
        if run.failed or request.ended:
            return
        lp = self.parts[i]
        feeds = {t: run.values[t] for t in lp.partition.inputs}
        if self.remote and not lp.device.takes_remote:
            try:
                feeds = local(feeds)
            except ExecutionError as exc:
                self._fail(run, request, done, exc, lp)
                return
        tag = self._tag(request, lp)
        if request.inline:  # only the first stage: later ones pipeline on device threads
            request.inline = False
            try:
                outputs = lp.device.run_now(lp.key, feeds, tag)
            except ExecutionError as exc:
                self._fail(run, request, done, exc, lp)
                return
            if outputs is not None:
                self._advance(run, request, outputs, done)
                return
        lp.device.call(lp.key, feeds, tag, partial(self._landed, run, request, done, lp))

    def _landed(self, run: _Run, request: Request, done: Done, lp: LoadedPartition,
                outputs: Outputs | None, error: ExecutionError | None) -> None:
        if error is None and outputs is not None:
            self._advance(run, request, outputs, done)
        else:
            self._fail(run, request, done, error or ExecutionError(
                f"{lp.device.name} returned nothing for {lp.key}"), lp)

    def _fail(self, run: _Run, request: Request, done: Done, error: BaseException,
              lp: LoadedPartition | None = None) -> None:
        if not run.failed and not request.ended:
            run.failed = True
            if lp is not None and isinstance(error, ExecutionError):
                _named(error, lp)
            done(request, None, error)

    def _advance(self, run: _Run, request: Request, outputs: Outputs, done: Done) -> None:
        if run.failed or request.ended:
            return
        try:
            ready = []
            with run.lock:
                for t, value in outputs.items():
                    run.values[t] = value
                    for r in self.readers.get(t, ()):
                        run.missing[r] -= 1
                        if run.missing[r] == 0:
                            ready.append(r)
                run.landed += 1
                finished = run.landed == len(self.parts)
            for r in ready:
                self._launch(run, request, r, done)
            if finished:
                outputs = {t: run.values[t] for t in self.outputs}
                done(request, local(outputs) if self.remote else outputs, None)
        except Exception as exc:  # a bug here must still end the request
            self._fail(run, request, done, exc)


def _named(error: ExecutionError, lp: LoadedPartition) -> ExecutionError:
    """The error, marked with the partition and device it came from."""
    error.partition, error.device = lp.partition.name, lp.device.name
    return error
