"""The standalone driver: runs a bundle's schedule table with onnxruntime alone.

    with open_bundle("gpt2.prism", policy="pipelined") as driver:
        outputs = driver.run({"input_ids": ids, "attention_mask": mask})

Table-driven: each schedule row names a partition, its device, the tensors it reads
and writes and the rows it waits for; the policy, chosen at open, decides how rows run:

- `serial`: one row after another, in table order, on the caller's thread.
- `parallel`: one request at a time; rows whose inputs are ready run at once, each on
  its device's worker thread (a device runs one row at a time).
- `pipelined`: the same workers with many requests in flight, so one request's later
  rows overlap the next one's earlier rows; `run` may be called from many threads.

It imports only numpy, onnxruntime, the bundle reader (with its protobuf walk), and the
feed check, the request memory and the session options it shares with the just-in-time
path (no partitioner, no onnx, no events); the suite checks that in a fresh interpreter.
As the host, it refuses a request past the machine's memory in one line, and gives back
what an outsized one took (`RequestMemory.admit`, `ArenaDebt`). `cpu` and `sim` rows
run in onnxruntime (a `sim` row computes its values; the driver models no time);
`reference` rows need onnx's evaluator and are refused.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from runtime.bundle.reader import EXTERNAL_LOCATION, Bundle, read_bundle
from runtime.devices.ort.options import ArenaDebt, new_session, refuse_empty
from runtime.errors import (
    BundleError,
    ExecutionError,
    RequestTimeoutError,
    drop_frames,
    first_line,
)
from runtime.inputs import FeedCheck, InputSpec, graph_outputs
from runtime.types import OutsizedFeeds

POLICIES = ("serial", "parallel", "pipelined")
RUNS_IN_ORT = ("cpu", "sim", "ray")  # a ray actor runs an onnxruntime session too
DEFAULT_TIMEOUT = 300.0  # seconds `run` waits for an answer (parallel, pipelined)
_POLL = 0.5  # bound on each idle worker wait


class Stage:
    """One schedule row, loaded: its session and the names it reads and writes."""

    __slots__ = ("after", "arena", "check", "device", "index", "names", "partition", "reads",
                 "session", "weights")

    def __init__(self, index: int, row: Mapping, session: ort.InferenceSession,
                 weights: np.ndarray, ops: Iterable[str] = ()):
        self.index, self.partition, self.device = index, row["partition"], row["device"]
        self.reads, self.after = tuple(row["reads"]), tuple(row["after"])
        self.session = session
        self.weights = weights  # keeps the mapping alive while onnxruntime may read it
        self.names = [o.name for o in session.get_outputs()]
        self.check = refuse_empty(ops)
        self.arena = ArenaDebt()

    def run(self, feeds: dict, outsized: bool) -> dict:
        if self.check is not None:
            self.check(feeds)
        return dict(zip(self.names, self.arena.run(self.session.run, self.names, feeds,
                                                   outsized), strict=True))


def load_stage(bundle: Bundle, index: int, row: Mapping) -> Stage:
    """A schedule row's partition as an onnxruntime session; BundleError if it will not."""
    where = f"{bundle.path}: partition {row['partition']}"
    if row["backend"] not in RUNS_IN_ORT:
        raise BundleError(f"{where} runs on a {row['backend']} device; the driver runs "
                          f"{' and '.join(RUNS_IN_ORT)} partitions only")
    model, weights = bundle.member(row["model"]), bundle.weights()
    try:
        session = new_session(model, row["threads"], {EXTERNAL_LOCATION: weights},
                              row.get("half", False), spin=row.get("spin", True))
    except Exception as exc:
        raise BundleError(f"{where} does not load in onnxruntime {ort.__version__}: "
                          f"{first_line(exc)}") from None
    ops = next((r["ops"] for r in bundle.manifest.get("requirements", ())
                if r["partition"] == row["partition"]), ())
    return Stage(index, row, session, weights, ops)


class _Request:
    __slots__ = ("future", "landed", "lock", "missing", "outsized", "values")

    def __init__(self, values: dict, missing: list[int], outsized: bool):
        self.values, self.missing, self.landed, self.outsized = values, missing, 0, outsized
        self.lock = threading.Lock()
        self.future: Future = Future()


class _Worker:
    """A device's thread: runs its rows, one at a time, in arrival order."""

    def __init__(self, driver: Driver, device: str):
        self.driver = driver
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=f"prism-driver-{device}",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=_POLL)
            except queue.Empty:
                if self.driver.closed:
                    return
                continue
            if job is None:
                return
            self.driver._execute(*job)
            job = None  # an idle worker must not pin the last request's tensors


class Driver:
    """Runs one bundle under one policy. Make it with `open_bundle`."""

    def __init__(self, bundle: Bundle, stages: list[Stage], policy: str,
                 timeout: float = DEFAULT_TIMEOUT):
        manifest = bundle.manifest
        self.bundle, self.stages, self.policy, self.timeout = bundle, stages, policy, timeout
        self.network: str = manifest["network"]
        self.inputs: list[dict] = manifest["inputs"]
        # feeds checked as the host checks them: dtype, rank, fixed and named dimensions, and
        # what a request's activations need at its sizes (`RequestMemory.admit`)
        memory = bundle.request_memory()
        self._check = FeedCheck(self.network, [InputSpec.from_dict(i) for i in self.inputs],
                                None if memory is None else partial(memory.admit, self.network)
                                ).check
        self.outputs: list[str] = manifest["outputs"]
        self.passed = [i["name"] for i in self.inputs if i["name"] in self.outputs]  # copied
        self.constants = bundle.constants()
        # the table's dependencies: rows each row waits for, rows each row releases
        index = {s.partition: s.index for s in stages}
        self._waits = [len(s.after) for s in stages]
        self._releases: list[list[Stage]] = [[] for _ in stages]
        for stage in stages:
            for name in stage.after:
                self._releases[index[name]].append(stage)
        self.closed = False
        self._lock = threading.Lock()
        self._in_flight: set[_Request] = set()
        self._one_at_a_time = threading.Lock() if policy == "parallel" else None
        self._workers = {} if policy == "serial" else {
            d: _Worker(self, d) for d in dict.fromkeys(s.device for s in stages)}

    def __repr__(self) -> str:
        return (f"Driver({self.network}, {len(self.stages)} partitions, {self.policy}"
                f"{', closed' if self.closed else ''})")

    # -- requests ----------------------------------------------------------------------

    def run(self, feeds: Mapping[str, object], timeout: float | None = None
            ) -> dict[str, np.ndarray]:
        """One request: graph output name -> array. Raises InvalidInputError for bad feeds,
        ExecutionError naming the partition and device that failed, RequestTimeoutError
        after `timeout` seconds (the driver's default) under parallel and pipelined."""
        if self.closed:
            raise BundleError(f"the driver for {self.network} is closed")
        checked = self._check(feeds)
        values, outsized = {**checked, **self.constants}, type(checked) is OutsizedFeeds
        if self.policy == "serial":
            for stage in self.stages:
                values.update(self._call(stage, {t: values[t] for t in stage.reads}, outsized))
            return graph_outputs(values, self.outputs, self.passed)
        wait = self.timeout if timeout is None else timeout
        if self._one_at_a_time is None:
            return self._await(self._start(values, outsized), wait)
        if not self._one_at_a_time.acquire(timeout=wait):
            raise RequestTimeoutError(f"{self.network}: no turn to run within {wait:g} s")
        try:
            return self._await(self._start(values, outsized), wait)
        finally:
            self._one_at_a_time.release()

    def _await(self, request: _Request, wait: float) -> dict[str, np.ndarray]:
        try:
            return request.future.result(timeout=wait)
        except FutureTimeout:
            self._end(request, error=RequestTimeoutError(
                f"{self.network}: no answer within {wait:g} s"))
            return request.future.result(timeout=0)

    def _start(self, values: dict, outsized: bool) -> _Request:
        request = _Request(values, list(self._waits), outsized)
        with self._lock:
            if self.closed:
                raise BundleError(f"the driver for {self.network} is closed")
            self._in_flight.add(request)
        if not self.stages:
            self._end(request, graph_outputs(values, self.outputs, self.passed))
        for stage in self.stages:
            if request.missing[stage.index] == 0:
                self._workers[stage.device].jobs.put((stage, request))
        return request

    def _execute(self, stage: Stage, request: _Request) -> None:
        """A worker runs one row of one request, then hands on the rows it made ready."""
        if self.closed or request.future.done():
            return  # failed, timed out or closed meanwhile: the rest is abandoned
        try:
            with request.lock:
                feeds = {t: request.values[t] for t in stage.reads}
            outputs = self._call(stage, feeds, request.outsized)
            ready = []
            with request.lock:
                request.values.update(outputs)
                for nxt in self._releases[stage.index]:
                    request.missing[nxt.index] -= 1
                    if request.missing[nxt.index] == 0:
                        ready.append(nxt)
                request.landed += 1
                finished = request.landed == len(self.stages)
        except BaseException as exc:  # the first error wins; the request ends with it
            self._end(request, error=exc)
            return
        for nxt in ready:
            self._workers[nxt.device].jobs.put((nxt, request))
        if finished:
            self._end(request, graph_outputs(request.values, self.outputs, self.passed))

    def _end(self, request: _Request, outputs: dict | None = None,
             error: BaseException | None = None) -> None:
        """Settle a request exactly once (later calls are ignored)."""
        with self._lock:
            if request not in self._in_flight:
                return
            self._in_flight.discard(request)
        if error is None:
            request.future.set_result(outputs)
        else:
            request.future.set_exception(error)

    def _call(self, stage: Stage, feeds: dict, outsized: bool) -> dict:
        try:
            return stage.run(feeds, outsized)
        except Exception as exc:
            error = ExecutionError(f"{self.network}/{stage.partition} on {stage.device}: "
                                   f"{first_line(exc)}")
            error.partition, error.device = stage.partition, stage.device
            raise error from None

    # -- lifetime ----------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers (each waited for up to `timeout`), fail requests still in
        flight, release every session and the bundle. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            pending = list(self._in_flight)
        for worker in self._workers.values():
            worker.jobs.put(None)
        for worker in self._workers.values():
            worker.thread.join(timeout)
        for request in pending:
            self._end(request, error=BundleError(f"the driver for {self.network} closed "
                                                 f"before the request finished"))
        self.stages, self._workers = [], {}
        self.bundle.close()

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_bundle(path: str | Path, policy: str = "serial", *,
                timeout: float = DEFAULT_TIMEOUT) -> Driver:
    """Open a bundle and load every partition; BundleError (one line) with nothing left
    open if the file is not a sound bundle or a partition does not load."""
    if policy not in POLICIES:
        raise BundleError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    bundle = read_bundle(path)
    stages: list[Stage] = []
    try:
        for i, row in enumerate(bundle.manifest["schedule"]):
            stages.append(load_stage(bundle, i, row))
        return Driver(bundle, stages, policy, timeout)
    except BaseException as exc:
        stages.clear()  # sessions, and the frames that held the weights, go before the
        drop_frames(exc)  # mapping they read, so it closes
        bundle.close()
        if isinstance(exc, KeyError | TypeError | ValueError):
            raise BundleError(f"{bundle.path}: manifest is malformed: {first_line(exc)}"
                              ) from None
        raise
