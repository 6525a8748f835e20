"""Executor: runs requests over one replica of a plan (its partitions, loaded once).

`start(request, done)` is the way every request runs, a batch included. A partition
starts on its device as soon as every tensor it reads exists; its outputs may start
children. The first stage of a request that may run inline (`request.inline`) runs on
the caller's thread when its device is idle (for a one-partition plan, that is the whole
request); every later stage queues on its device's own thread, so a caller sending many
requests gets them pipelined: different requests' stages overlap on different devices. A
caller that waits for the answer (`request.waited`: `HostManager.infer`) sends no other
meanwhile, so each stage whose device is idle runs on its thread, sparing two thread
hand-offs a stage. Of the partitions one run makes ready, the others are sent to their
devices before the one that may run here, so branches still run at once.
Tensors stay in host memory and pass by reference; the plan's transfers model what a
real copy would cost (and `sim` devices are held for it). The first error wins and ends
the request; its other partitions are abandoned.

Guarded, whatever the device: a partition's outputs are checked against its declared
ones before anything reads them (`checks.OutputCheck`), and any failure of a run, an
exception from the device included, ends the request with an ExecutionError naming the
partition, the device and what went wrong. A BaseException that is not an Exception
(KeyboardInterrupt during an inline run) ends the request the same way and then goes on
up the caller's thread, where it was meant to land.

`run_now(feeds, wait)` runs a plan of one partition (`single`) on the caller's thread
with no request record: the host's lean path (runtime/host/lean.py). It is the device's
own fast path (`Device.run_now`) and the same output check every stage passes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from runtime.devices.device import Device
from runtime.devices.remote import local
from runtime.errors import ExecutionError, described
from runtime.executor.checks import OutputCheck
from runtime.executor.requests import Request, RequestDone
from runtime.inputs import Signature, graph_outputs
from runtime.partition.plan import Partition
from runtime.types import Outputs, OutsizedFeeds, Tag

# run_now(feeds, wait=0.0, request=None): a one-partition plan run on the caller's thread
SingleRun = Callable[..., "Outputs | None"]


@dataclass(frozen=True)
class LoadedPartition:
    """A partition as the provisioner loaded it: on `device`, under `key`."""

    partition: Partition
    key: str
    device: Device


# Stages one waiting caller runs on its thread at most, each a few frames deeper in its
# stack: later ones go to their devices' threads.
INLINE_STAGES = 64


class _Run:
    """One request in flight: the tensors it has, and the inputs each partition lacks."""

    __slots__ = ("failed", "landed", "lock", "missing", "values")

    def __init__(self, values: dict[str, np.ndarray], missing: list[int]):
        self.values, self.missing = values, missing
        self.landed = 0
        self.failed = False
        self.lock = threading.Lock()


class Executor:
    def __init__(self, face: Signature, loaded: Sequence[LoadedPartition], network: str,
                 bus: Any = None, checks: Sequence[OutputCheck] | None = None):
        """`checks`: per partition, what its outputs must be (by default, only there)."""
        self.network, self.parts, self.bus = network, list(loaded), bus
        self.outputs = list(face.outputs)
        self.constants = dict(face.constants)
        fed = set(face.input_names)
        self.passed = [t for t in self.outputs if t in fed]  # given back: copied
        self.checks = list(checks) if checks is not None else [
            OutputCheck.names(lp.partition.outputs) for lp in loaded]
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
        # A `single` plan on this thread, with no request record (the host's lean path)
        self.run_now: SingleRun | None = self._single_run() if self.single else None

    def _single_run(self) -> SingleRun:
        """`run_now` for a `single` plan, a closure over what each run reads."""
        lp = self.parts[0]
        device_run, key, problem, network = lp.device.run_now, lp.key, self.checks[0].problem, \
            self.network
        order = self.outputs if self._reorder else None

        def run_now(feeds: dict[str, np.ndarray], wait: float = 0.0,
                    request: int | None = None) -> Outputs | None:
            """The graph outputs, or None if its device stayed busy (`wait`: seconds to wait
            in its line). Raises ExecutionError naming the partition and the device. With
            a `request` id, the run publishes its events."""
            tag = None if request is None else {"network": network, "request": request,
                                                "partition": lp.partition.name}
            try:
                outputs = device_run(key, feeds, tag, wait)
            except Exception as exc:
                raise _failure(exc, lp)  # noqa: B904 (its cause is kept)
            if outputs is None:
                return None
            if (wrong := problem(outputs)) is not None:
                raise _bad_result(wrong, lp)
            return outputs if order is None else {t: outputs[t] for t in order}

        return run_now

    def start(self, request: Request, done: RequestDone) -> None:
        """Run `request`; `done(request, outputs, error)` is called once when it ends."""
        run = _Run({**request.feeds, **self.constants}, list(self.missing))
        if not self.parts:
            done(request, graph_outputs(run.values, self.outputs, self.passed), None)
            return
        # Collect first: a partition that runs inline may make others ready meanwhile.
        self._launch_all(run, request, [i for i, count in enumerate(run.missing) if count == 0],
                         done)

    def _tag(self, request: Request, lp: LoadedPartition) -> Tag | None:
        if self.bus is None or not self.bus.active:
            return None
        return {"network": self.network, "request": request.id, "partition": lp.partition.name}

    def _launch_all(self, run: _Run, request: Request, ready: list[int], done: RequestDone
                    ) -> None:
        """Launch the ready partitions, the last one where it may run inline: the others are
        on their devices' threads by then."""
        last = len(ready) - 1
        for k, i in enumerate(ready):
            self._launch(run, request, i, done, here=k == last)

    def _launch(self, run: _Run, request: Request, i: int, done: RequestDone,
                here: bool) -> None:
        if run.failed or request.ended:
            return
        lp = self.parts[i]
        feeds = {t: run.values[t] for t in lp.partition.inputs}
        if self.remote and not lp.device.takes_remote:
            try:
                feeds = local(feeds)
            except ExecutionError as exc:
                self._fail(run, request, done, _named(exc, lp))
                return
        if type(request.feeds) is OutsizedFeeds:
            feeds = OutsizedFeeds(feeds)
        tag = self._tag(request, lp)
        if here and request.inline and run.landed < INLINE_STAGES:  # the first stage, or
            request.inline = request.waited  # every one for a caller that waits
            try:
                outputs = lp.device.run_now(lp.key, feeds, tag)
            except BaseException as exc:
                self._fail(run, request, done, _failure(exc, lp))
                if not isinstance(exc, Exception):
                    raise  # KeyboardInterrupt and the like: the request has ended; go on up
                return
            if outputs is not None:
                self._advance(run, request, i, outputs, done)
                return
        lp.device.call(lp.key, feeds, tag, partial(self._landed, run, request, done, i))

    def _landed(self, run: _Run, request: Request, done: RequestDone, i: int,
                outputs: Outputs | None, error: ExecutionError | None) -> None:
        if error is None and outputs is not None:
            self._advance(run, request, i, outputs, done)
        else:
            lp = self.parts[i]
            self._fail(run, request, done, _named(error or ExecutionError(
                f"{lp.device.name} returned nothing for {lp.key}"), lp))

    def _fail(self, run: _Run, request: Request, done: RequestDone, error: BaseException) -> None:
        if not run.failed and not request.ended:
            run.failed = True
            done(request, None, error)

    def _advance(self, run: _Run, request: Request, i: int, outputs: Outputs, done: RequestDone
                 ) -> None:
        if run.failed or request.ended:
            return
        lp = self.parts[i]
        if (problem := self.checks[i].problem(outputs)) is not None:
            self._fail(run, request, done, _bad_result(problem, lp))
            return
        try:
            ready = []
            with run.lock:
                for t in lp.partition.outputs:  # as declared: a device's extras are ignored
                    run.values[t] = outputs[t]
                    for r in self.readers.get(t, ()):
                        run.missing[r] -= 1
                        if run.missing[r] == 0:
                            ready.append(r)
                run.landed += 1
                finished = run.landed == len(self.parts)
            self._launch_all(run, request, ready, done)
            if finished:
                outputs = graph_outputs(run.values, self.outputs, self.passed)
                run.values.clear()  # what its stages passed is gone before its caller wakes
                done(request, local(outputs) if self.remote else outputs, None)
        except Exception as exc:  # a bug here must still end the request
            self._fail(run, request, done, exc)


def _named(error: ExecutionError, lp: LoadedPartition) -> ExecutionError:
    """The error, marked with the partition and device it came from."""
    error.partition, error.device = lp.partition.name, lp.device.name
    return error


def _failure(exc: BaseException, lp: LoadedPartition) -> ExecutionError:
    """Whatever a device's run raised, as an ExecutionError naming partition and device."""
    if isinstance(exc, ExecutionError):
        return _named(exc, lp)
    verb = "failed" if isinstance(exc, Exception) else "was interrupted"
    error = ExecutionError(f"{lp.device.name} {verb} running {lp.key}: {described(exc)}")
    error.__cause__ = exc
    return _named(error, lp)


def _bad_result(problem: str, lp: LoadedPartition) -> ExecutionError:
    return _named(ExecutionError(f"{lp.device.name} returned a bad result for {lp.key}: "
                                 f"{problem}"), lp)
