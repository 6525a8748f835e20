"""`prism run`: drive a model with load, show progress, then throughput and latency tables."""

from __future__ import annotations

import argparse
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from zipfile import BadZipFile

import numpy as np
from numpy.lib.npyio import NpzFile
from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.loadgen import LoadGenerator
from app.loading import load_options
from runtime.devices import parse_devices
from runtime.devices.ort import cpu_session, loadable
from runtime.errors import InvalidInputError, PrismError, first_line
from runtime.events import JsonlRecorder
from runtime.host import HostManager
from runtime.inputs import InputSpec, check_feeds
from runtime.metrics import Metrics, MetricsSnapshot
from runtime.units import human_bytes, human_seconds


class OutputCheck:
    """Compares every answer with the whole model run in plain onnxruntime."""

    def __init__(self, model) -> None:
        self.session = cpu_session(loadable(model))
        self.names = [o.name for o in self.session.get_outputs()]
        self.lock = threading.Lock()
        self.worst: tuple[float, str] = (0.0, "")
        self.mismatch: str | None = None

    def __call__(self, feeds: dict, outputs: dict | None, error, latency: float) -> None:
        if outputs is None:
            return
        with self.lock:
            expected = self.session.run(self.names, feeds)
        for name, want in zip(self.names, expected, strict=True):
            got = np.asarray(outputs[name])
            if want.dtype.kind not in "fc":
                same = np.array_equal(got, want)
                err = 0.0 if same else float("inf")
            else:
                err = float(np.max(np.abs(got - want), initial=0.0))
                same = got.shape == want.shape and np.allclose(got, want, rtol=1e-4, atol=1e-5)
            with self.lock:
                self.worst = max(self.worst, (err, name))
                if not same and self.mismatch is None:
                    self.mismatch = (f"output {name!r} differs from onnxruntime: "
                                     f"largest error {err:.3g}")


def summary_table(snap: MetricsSnapshot, wall: float, stats) -> Table:
    table = Table(title="requests", box=box.SIMPLE_HEAD)
    for col in ("done", "failed", "rejected", "wall", "throughput", "p50", "p95", "p99"):
        table.add_column(col, justify="right")
    lat = snap.latency
    table.add_row(str(stats.ok), str(stats.failed), str(stats.rejected), human_seconds(wall),
                  f"{stats.ok / wall:.1f}/s" if wall else "-", human_seconds(lat.p50),
                  human_seconds(lat.p95), human_seconds(lat.p99))
    return table


def partition_table(snap: MetricsSnapshot) -> Table:
    table = Table(title="partitions (run time)", box=box.SIMPLE_HEAD)
    for col in ("partition", "device", "runs", "p50", "p95", "p99", "queue wait"):
        table.add_column(col, justify="left" if col in ("partition", "device") else "right")
    for key, p in sorted(snap.partitions.items()):
        table.add_row(key, p.device or "-", str(p.count), human_seconds(p.p50),
                      human_seconds(p.p95), human_seconds(p.p99), human_seconds(p.mean_queue_wait))
    return table


def device_table(snap: MetricsSnapshot) -> Table:
    table = Table(title="devices", box=box.SIMPLE_HEAD)
    for col in ("device", "runs", "busy", "utilisation", "memory"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for name, d in sorted(snap.devices.items()):
        table.add_row(name, str(d.runs), human_seconds(d.busy_seconds), f"{d.utilisation:.0%}",
                      f"{human_bytes(d.used_bytes)} / {human_bytes(d.total_bytes)}")
    return table


def read_inputs(path: str, network: str, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    """The feeds in an .npz file, checked against the model's inputs before anything runs."""
    try:
        stored = np.load(path, allow_pickle=False)
        if not isinstance(stored, NpzFile):
            raise ValueError("not an .npz archive of named arrays (numpy.savez)")
        with stored:
            feeds = dict(stored)
    except (OSError, ValueError, EOFError, BadZipFile) as exc:
        raise PrismError(f"cannot read inputs {path}: {first_line(exc)}") from None
    try:
        return check_feeds(network, specs, feeds)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{path}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    console, errors = Console(), Console(stderr=True)
    options = load_options(args)
    devices = parse_devices(args.devices)
    binds = options["bindings"]
    name = Path(args.model).stem
    with HostManager(devices, max_queue=max(100, args.concurrency * 2)) as host:
        metrics = Metrics()
        subscription = host.bus.subscribe(maxlen=200_000)
        host.add_network(name, args.model, **options)
        feeds = read_inputs(args.inputs, name, host.inputs(name)) if args.inputs else None
        # a bundle is checked against the whole network stored inside it
        check = OutputCheck(host.graph(name).model) if args.check else None
        recorder = JsonlRecorder(host.bus, args.record) if args.record else nullcontext()
        load = LoadGenerator(host, name, concurrency=None if args.rate else args.concurrency,
                             rate=args.rate, requests=args.requests, bindings=binds,
                             feeds=feeds, on_result=check)
        with recorder, Progress(TextColumn("{task.description}"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                transient=True) as progress:
            task = progress.add_task(f"running {name}", total=args.requests)
            start = time.perf_counter()
            load.start()
            while not load.wait(timeout=0.1):
                metrics.feed(subscription.drain())
                progress.update(task, completed=load.stats.done)
            wall = time.perf_counter() - start
            load.stop()
        metrics.feed(subscription.drain())
        snap = metrics.snapshot()
        console.print(Group(summary_table(snap, wall, load.stats), partition_table(snap),
                            device_table(snap)))
        for message in sorted(set(load.stats.errors))[:5]:
            errors.print(f"[red]error:[/] {escape(message)}", highlight=False)
    if check is not None:
        if check.mismatch:
            raise PrismError(check.mismatch)
        console.print(f"check: every output matches onnxruntime (largest error "
                      f"{check.worst[0]:.3g} in {check.worst[1] or '-'})")
    return 1 if load.stats.failed else 0
