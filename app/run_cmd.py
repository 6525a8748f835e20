"""`prism run`: drive a model with load, show progress, then throughput and latency tables."""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

import numpy as np
from rich import box
from rich.console import Group
from rich.table import Table

from app.arguments import load_options, output_file, run_devices, writing
from app.console import plain_console, progress_on
from app.given_inputs import given_inputs
from app.loadgen import LoadGenerator, LoadStats
from app.measuring import add_network_measuring
from runtime.devices.ort.sessions import cpu_session
from runtime.errors import PrismError, ProvisionError, first_line
from runtime.fold import RANDOM_OPS
from runtime.graph import Graph
from runtime.host import HostManager
from runtime.observe.events import JsonlRecorder
from runtime.observe.metrics import Metrics, MetricsSnapshot
from runtime.observe.trace import ChromeTrace
from runtime.partition import Plan
from runtime.units import human_bytes, human_seconds

# (rtol, atol) for float32 and wider: room for kernels summing in another order
CHECK_TOLERANCE = (1e-4, 1e-5)
# the least relative room, in ulps (eps) of the output's own dtype: where the float16 roundings
# fall moves with the partitions (onnxruntime computes float16 ops in float, casting back only
# where a tensor leaves the session; a reference device computes in float16), a few ulps apart
CHECK_ULPS = 16


def _eps(dtype: np.dtype) -> float:
    return float(np.finfo(dtype).eps)


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing a float or complex output of `dtype` with onnxruntime's:
    CHECK_TOLERANCE, widened for a narrower dtype to CHECK_ULPS of its eps, atol in the
    same ratio."""
    rtol, atol = CHECK_TOLERANCE
    wide = max(rtol, CHECK_ULPS * _eps(dtype))
    return wide, atol * wide / rtol


def narrowest_floats(graph: Graph) -> dict[str, np.dtype]:
    """Graph output -> the narrowest float dtype among the tensors it is computed from (an
    autocast export's float32 output computed in float16): its check's room follows that,
    since the float16 roundings move with the partitions."""
    def own(t: str) -> np.dtype | None:
        info = graph.tensors.get(t)
        dtype = np.dtype(info.dtype) if info is not None and info.dtype else None
        return dtype if dtype is not None and dtype.kind in "fc" else None

    narrowest: dict[str, np.dtype] = {}
    for node in graph.nodes:  # in order: a node's inputs are made before it
        found = [d for t in (*node.reads, *node.outputs) for d in (own(t), narrowest.get(t))
                 if d is not None]
        if found:
            narrowest.update(dict.fromkeys(node.outputs, max(found, key=_eps)))
    return {t: narrowest[t] for t in graph.outputs if t in narrowest}


def difference(got: object, want: object, computed: np.dtype | None = None
               ) -> tuple[float, str | None]:
    """(largest error, what differs or None) between Prism's output and onnxruntime's.
    NaN where onnxruntime has NaN is no difference; a shape, dtype or NaN that does not
    match is an infinite one. Sequences compare element by element, maps (a ZipMap's
    class scores) value by value. `computed`: the narrowest float the output is computed
    from, where narrower than its own."""
    if isinstance(want, list) or isinstance(got, list):
        if not isinstance(got, list) or not isinstance(want, list) or len(got) != len(want):
            return float("inf"), "a sequence of another length"
        found = [difference(g, w, computed) for g, w in zip(got, want, strict=True)]
        return max(found, key=lambda f: (f[1] is not None, f[0]), default=(0.0, None))
    if isinstance(want, dict) or isinstance(got, dict):
        if not isinstance(got, dict) or not isinstance(want, dict) or got.keys() != want.keys():
            return float("inf"), "a map of other keys"
        return difference(np.asarray([got[k] for k in want]), np.asarray(list(want.values())),
                          computed)
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return float("inf"), (f"{got.dtype} {list(got.shape)}, where onnxruntime gives "
                              f"{want.dtype} {list(want.shape)}")
    if want.dtype.kind not in "fc":
        same = np.array_equal(got, want)
        return (0.0, None) if same else (float("inf"), "other values")
    with np.errstate(invalid="ignore", over="ignore"):
        gap = np.asarray(abs(got.astype(np.complex128 if want.dtype.kind == "c" else np.float64)
                             - want))  # an array for a scalar output too
    gap[(got == want) | (np.isnan(got) & np.isnan(want))] = 0.0  # equal infinities, twin NaNs
    gap[np.isnan(gap)] = np.inf  # NaN on one side only
    err = float(gap.max(initial=0.0))
    rtol, atol = tolerance(want.dtype if computed is None else max(want.dtype, computed,
                                                                     key=_eps))
    same = np.allclose(got, want, rtol=rtol, atol=atol * _scale(want), equal_nan=True)
    return err, None if same else f"largest error {err:.3g}"


def _scale(want: np.ndarray) -> float:
    """The output's largest finite magnitude, at least 1: what the absolute room grows by.
    Kernels summing in another order err by the size of the terms, not of an element that
    sums to near zero (fcn_resnet50's outputs reach 41 and differ by 2.2e-5 beside zero
    over two devices; onnxruntime with and without its optimizations, by 4.3e-5)."""
    finite = np.abs(want[np.isfinite(want)])
    return max(1.0, float(finite.max(initial=0.0)))


def random_outputs(graph: Graph) -> dict[str, str]:
    """Graph output -> the random op its values come from (in a subgraph too): run twice,
    onnxruntime itself gives other values, so only its dtype and shape can be compared."""
    source: dict[str, str] = {}
    for node in graph.nodes:  # in order: a node's inputs are made before it
        ops = [node.op_type, *(op for _, op in node.body_ops)]
        random = next((op for op in ops if op in RANDOM_OPS), None) or (
            "Dropout" if node.op_type == "Dropout" and len(node.inputs) > 2 else None)
        found = random or next((source[t] for t in node.reads if t in source), None)
        if found is not None:
            source.update(dict.fromkeys(node.outputs, found))
    return {t: source[t] for t in graph.outputs if t in source}


class OutputCheck:
    """Compares every answer with the whole model run in plain onnxruntime (an output of
    a random op by its dtype and shape alone)."""

    def __init__(self, graph: Graph) -> None:
        try:
            self.session = cpu_session(graph.model, stamp=True)
        except ProvisionError as exc:  # Prism may run it (a reference device) all the same
            raise PrismError(f"--check compares with {graph.name} whole in onnxruntime, which "
                             f"cannot run it: {exc}; run it without --check") from None
        self.model = graph.model
        self.random = random_outputs(graph)
        self.computed = narrowest_floats(graph)
        self.names = [o.name for o in self.session.get_outputs()]
        self.lock = threading.Lock()
        self.worst: tuple[float, str] = (0.0, "")
        self.mismatch: str | None = None
        self.differing: tuple[dict, str, float] | None = None  # its feeds, output and error
        self.compared = 0  # answers checked

    def __call__(self, feeds: dict, outputs: dict | None, error, latency: float) -> None:
        if outputs is None:
            return
        try:
            with self.lock:
                expected = self.session.run(self.names, feeds)
        except Exception as exc:  # runs on a runtime thread: never raise there
            self._differs(f"onnxruntime fails on feeds Prism answered: {first_line(exc)}")
            return
        for name, want in zip(self.names, expected, strict=True):
            got = outputs.get(name)
            if name in self.random and isinstance(want, np.ndarray):
                got = want if isinstance(got, np.ndarray) and (got.shape, got.dtype) == (
                    want.shape, want.dtype) else got  # the values are not compared
            err, why = difference(got, want, self.computed.get(name))
            with self.lock:
                self.worst = max(self.worst, (err, name))
            if why is not None:
                self._differs(f"output {name!r} differs from onnxruntime: {why}",
                              (feeds, name, err))
        with self.lock:
            self.compared += 1

    def _differs(self, message: str, differing: tuple[dict, str, float] | None = None) -> None:
        with self.lock:
            if self.mismatch is None:
                self.mismatch, self.differing = message, differing

    def noise(self) -> str:
        """After a mismatch in values: how far onnxruntime's own answer on that input
        moves with its graph optimizations off. A cut between partitions changes which
        nodes onnxruntime fuses as much, so an error within that is the model's rounding
        noise (a random-weight RT-DETR's TopK picks other queries over near ties; an int8
        YOLO's requantizations), and one far past it a fault."""
        if self.differing is None or not math.isfinite(self.differing[2]):
            return ""
        feeds, name, err = self.differing
        try:
            with self.lock:
                [want] = self.session.run([name], feeds)
            [plain] = cpu_session(self.model, stamp=True, optimized=False).run([name], feeds)
        except Exception:  # a model onnxruntime runs only optimized: nothing to tell
            return ""
        own, _ = difference(plain, want, self.computed.get(name))
        verdict = ": rounding noise this model amplifies" if own >= err else ""
        return (f"; on that input onnxruntime with its graph optimizations off differs from "
                f"itself by {own:.3g}{verdict}")


def summary_table(snap: MetricsSnapshot, wall: float, stats) -> Table:
    table = Table(title="requests", box=box.SIMPLE_HEAD)
    for col in ("done", "failed", "rejected", "wall", "throughput", "p50", "p95", "p99"):
        table.add_column(col, justify="right")
    lat = snap.latency
    table.add_row(str(stats.ok), str(stats.failed), str(stats.rejected), human_seconds(wall),
                  f"{stats.ok / wall:.1f}/s" if wall else "-", human_seconds(lat.p50),
                  human_seconds(lat.p95), human_seconds(lat.p99))
    return table


def partition_table(snap: MetricsSnapshot, plan: Plan) -> Table:
    """Each partition's run times beside what its plan estimated (`est`: the plan serving
    at the end, learned from the runs if the host re-planned)."""
    table = Table(title="partitions (run time)", box=box.SIMPLE_HEAD)
    for col in ("partition", "device", "runs", "est", "p50", "p95", "p99", "queue wait"):
        table.add_column(col, justify="left" if col in ("partition", "device") else "right")
    est = _estimates(plan)
    for key, p in sorted(snap.partitions.items()):
        guess = est.get(p.partition)
        table.add_row(key, p.device or "-", str(p.count),
                      "-" if guess is None else human_seconds(guess), human_seconds(p.p50),
                      human_seconds(p.p95), human_seconds(p.p99), human_seconds(p.mean_queue_wait))
    return table


def _estimates(plan: Plan) -> dict[str, float]:
    return {p.name: p.est_seconds for p in plan.partitions}


def figures(snap: MetricsSnapshot, wall: float, stats: LoadStats, plan: Plan,
            check: OutputCheck | None) -> dict:
    """The tables' figures for `--json` (seconds, bytes), and the check's."""
    lat, est = snap.latency, _estimates(plan)
    return {
        "network": plan.network, "costs": plan.costs,
        "requests": {"done": stats.ok, "failed": stats.failed, "rejected": stats.rejected,
                     "wall_seconds": wall, "throughput": stats.ok / wall if wall else None,
                     "p50_seconds": lat.p50, "p95_seconds": lat.p95, "p99_seconds": lat.p99},
        "partitions": [{"partition": key, "device": p.device, "runs": p.count,
                        "est_seconds": est.get(p.partition), "p50_seconds": p.p50,
                        "p95_seconds": p.p95, "p99_seconds": p.p99,
                        "queue_wait_seconds": p.mean_queue_wait}
                       for key, p in sorted(snap.partitions.items())],
        "devices": [{"device": name, "runs": d.runs, "busy_seconds": d.busy_seconds,
                     "utilisation": d.utilisation, "used_bytes": d.used_bytes,
                     "total_bytes": d.total_bytes} for name, d in sorted(snap.devices.items())],
        "check": None if check is None else {
            "answers": check.compared, "largest_error": check.worst[0],
            "output": check.worst[1] or None, "mismatch": check.mismatch},
    }


def device_table(snap: MetricsSnapshot) -> Table:
    table = Table(title="devices", box=box.SIMPLE_HEAD)
    for col in ("device", "runs", "busy", "utilisation", "memory"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for name, d in sorted(snap.devices.items()):
        table.add_row(name, str(d.runs), human_seconds(d.busy_seconds), f"{d.utilisation:.0%}",
                      f"{human_bytes(d.used_bytes)} / {human_bytes(d.total_bytes)}")
    return table


def _problems(stats: LoadStats, check: OutputCheck | None, recorder) -> list[str]:
    """What went wrong, each in a few words: the run's one line on stderr."""
    found = []
    if stats.failed:
        counts = Counter(stats.errors)
        first, _ = counts.most_common(1)[0]
        others = f" ({len(counts) - 1} other errors; --record keeps them all)" \
            if len(counts) > 1 else ""
        found.append(f"{stats.failed} of {stats.done} requests failed: {first}{others}")
    if check is not None and check.mismatch:
        found.append(f"--check: {check.mismatch}{check.noise()}")
    elif check is not None and not check.compared and not found:
        found.append("--check: no request succeeded, so nothing was compared")
    if getattr(recorder, "error", None) is not None:
        found.append(f"--record {recorder.path} stopped: {first_line(recorder.error)}")
    return found


def run(args: argparse.Namespace) -> int:
    console = plain_console(stderr=args.json)  # stdout holds the JSON alone
    options = load_options(args)
    devices = run_devices(args)
    record = output_file(args.record, "--record") if args.record else None
    trace_path = output_file(args.trace, "--trace") if args.trace else None
    feeds = given_inputs(args, options)
    binds = options["bindings"]
    name = Path(args.model).stem
    with HostManager(devices, max_queue=max(100, args.concurrency * 2)) as host:
        metrics = Metrics()
        subscription = host.bus.subscribe(maxlen=200_000)
        trace = ChromeTrace(host.bus) if trace_path else None  # before the load: memory
        add_network_measuring(host, plain_console(stderr=True), name, args.model, **options)
        # the tables count this run's requests: not the runs a first load times its plan by
        metrics.feed([e for e in subscription.drain()
                      if not e.kind.startswith(("partition.run.", "request."))])
        metrics.begin(time.monotonic())
        # a bundle is checked against the whole network stored inside it
        check = OutputCheck(host.graph(name)) if args.check else None
        recorder = writing(record, "--record", lambda: JsonlRecorder(host.bus, record)) \
            if record else nullcontext()
        load = LoadGenerator(host, name, concurrency=None if args.rate else args.concurrency,
                             rate=args.rate, requests=args.requests, bindings=binds,
                             feeds=feeds, on_result=check)
        with recorder, progress_on(console) as progress:
            task = progress.add_task(f"running {name}", total=args.requests)
            start = time.perf_counter()
            load.start()
            while not load.wait(timeout=0.1):
                metrics.feed(subscription.drain())
                if trace is not None:
                    trace.collect()
                progress.update(task, completed=load.stats.done)
            wall = time.perf_counter() - start
            load.stop()
        metrics.feed(subscription.drain())
        snap, plan = metrics.snapshot(), host.plan(name)
        if args.json:
            print(json.dumps(figures(snap, wall, load.stats, plan, check), indent=2))
        else:
            console.print(Group(summary_table(snap, wall, load.stats),
                                partition_table(snap, plan), device_table(snap)))
        if trace is not None and trace_path is not None:
            plans = {name: host.plan(name)}
            count = writing(trace_path, "--trace", lambda: trace.write(trace_path, plans))
            console.print(f"trace: {count} events in {trace_path} (open it in "
                          f"https://ui.perfetto.dev)")
    problems = _problems(load.stats, check, recorder)
    if hint := load.hint():  # every request failed on made-up inputs
        problems[0] += hint
    if problems:
        raise PrismError("; ".join(problems))
    if check is not None and not args.json:
        console.print(f"check: every output matches onnxruntime ({check.compared} answers; "
                      f"largest error {check.worst[0]:.3g} in {check.worst[1] or '-'})"
                      + "".join(f"; {t} comes from {op}: its dtype and shape compared only"
                                for t, op in check.random.items()))
    return 0
