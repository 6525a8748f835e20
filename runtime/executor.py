"""Executor: runs one request over one provisioned copy of a plan.

A partition starts on its device as soon as every tensor it reads exists; its outputs
may start children. Many requests are in flight at once, so different requests'
stages overlap on different devices: that is the pipelining. Tensors stay in host
memory and pass by reference; the plan's transfers model what a real copy would
cost (and `sim` devices are held for it). The first error wins and ends the request;
its other partitions are abandoned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

import numpy as np
from onnx import numpy_helper

from runtime.errors import ExecutionError
from runtime.graph import Graph
from runtime.provision import LoadedPartition
from runtime.requests import Request

Done = Callable[[Request, dict[str, np.ndarray] | None, BaseException | None], None]


class _Run:
    __slots__ = ("failed", "landed", "lock", "missing", "values")

    def __init__(self, values: dict[str, np.ndarray], missing: list[int]):
        self.values, self.missing = values, missing
        self.landed = 0
        self.failed = False
        self.lock = threading.Lock()


class Executor:
    def __init__(self, graph: Graph, loaded: list[LoadedPartition], network: str, bus=None):
        self.network, self.parts, self.bus = network, loaded, bus
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
        self.outstanding = 0  # requests in flight on this copy; the host balances on it
        # The one-partition fast path hands over the feeds as given and returns its outputs:
        # only when it reads exactly the graph inputs and makes every graph output.
        self.single = len(loaded) == 1 and not self.constants and set(
            loaded[0].partition.inputs) == fed and set(self.outputs) <= set(
            loaded[0].partition.outputs)
        self.last_used = 0
        self._reorder = self.single and list(loaded[0].partition.outputs) != self.outputs

    def start(self, request: Request, done: Done) -> None:
        if request.inline and self.single:
            self._start_single(request, done)
            return
        run = _Run({**request.feeds, **self.constants}, list(self.missing))
        if not self.parts:
            done(request, {t: run.values[t] for t in self.outputs}, None)
            return
        # Collect first: a partition that runs inline may make others ready meanwhile.
        for i in [i for i, count in enumerate(run.missing) if count == 0]:
            self._launch(run, request, i, done)

    def _start_single(self, request: Request, done: Done) -> None:
        """One partition on an idle device: no per-request state, no locks of ours."""
        try:
            outputs = self.run_direct(request.feeds, self._tag(request, self.parts[0]))
        except ExecutionError as exc:
            done(request, None, exc)
            return
        if outputs is None:  # busy after all: the general path queues it
            run = _Run(dict(request.feeds), list(self.missing))
            self._launch(run, request, 0, done)
        else:
            done(request, outputs, None)

    def run_direct(self, feeds: dict[str, np.ndarray], tag: dict | None = None
                   ) -> dict[str, np.ndarray] | None:
        """A `single` plan on this thread: the graph outputs, or None if its device is busy.
        Raises ExecutionError naming the partition and the device."""
        lp = self.parts[0]
        try:
            outputs = lp.device.run_now(lp.key, feeds, tag)
        except ExecutionError as exc:
            exc.partition, exc.device = lp.partition.name, lp.device.name
            raise
        if outputs is None or not self._reorder:
            return outputs
        return {t: outputs[t] for t in self.outputs}

    def _tag(self, request: Request, lp: LoadedPartition) -> dict | None:
        if self.bus is None or not self.bus.active:
            return None
        return {"network": self.network, "request": request.id, "partition": lp.partition.name}

    def _launch(self, run: _Run, request: Request, i: int, done: Done) -> None:
        if run.failed or request.ended:
            return
        lp = self.parts[i]
        feeds = {t: run.values[t] for t in lp.partition.inputs}
        tag = self._tag(request, lp)
        if request.inline:
            # The caller's thread runs the first stage on an idle device, with no hand-off;
            # later stages go to the devices' own threads, so a caller sending many
            # requests gets them pipelined rather than run one after another.
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
                outputs: dict | None, error: BaseException | None) -> None:
        if error is None:
            self._advance(run, request, outputs, done)
        else:
            self._fail(run, request, done, error, lp)

    def _fail(self, run: _Run, request: Request, done: Done, error: BaseException,
              lp: LoadedPartition | None = None) -> None:
        if not run.failed and not request.ended:
            run.failed = True
            if lp is not None and isinstance(error, ExecutionError):
                error.partition, error.device = lp.partition.name, lp.device.name
            done(request, None, error)

    def _advance(self, run: _Run, request: Request, outputs: dict, done: Done) -> None:
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
                done(request, {t: run.values[t] for t in self.outputs}, None)
        except Exception as exc:  # a bug here must still end the request
            self._fail(run, request, done, exc)
