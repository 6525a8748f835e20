"""`prism bench`: Prism and one plain onnxruntime session under the same closed-loop load."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from rich import box
from rich.table import Table
from rich.text import Text

from app.arguments import load_options, run_devices
from app.console import plain_console
from app.given_inputs import given_inputs
from app.loadgen import LoadGenerator, plain_onnxruntime
from app.measuring import add_network_measuring
from runtime.errors import PrismError
from runtime.host import HostManager
from runtime.units import human_seconds


def _figures(rate: float, latencies: list[float]) -> dict:
    p50, p99 = np.percentile(latencies, [50, 99]) if latencies else (0.0, 0.0)
    return {"requests_per_second": rate, "p50_seconds": float(p50), "p99_seconds": float(p99)}


# flags for a model run here, which a server's model (`--url`) was loaded without
LOCAL = {"model": "MODEL", "devices": "--devices", "partition": "--partition", "bind": "--bind",
         "annotate": "--annotate", "fallback": "--fallback", "costs": "--costs",
         "ray_address": "--ray-address", "max_batch": "--max-batch", "replicas": "--replicas",
         "remap": "--remap"}
HINTS = {"MODEL": " (name a served model with --model M)",
         "--bind": " (send variable dimensions' sizes with --shape INPUT=D,D,...)"}


def run(args: argparse.Namespace) -> int:
    if args.url:
        from app.http_bench import run as run_url

        local = next((flag for key, flag in LOCAL.items() if getattr(args, key)), None)
        if local:
            raise PrismError(f"prism bench --url loads a model as the server serves it: "
                             f"{local} is for a model run here{HINTS.get(local, '')}")
        return run_url(args)
    if args.shape:
        raise PrismError("--shape is for --url; a model run here takes its symbolic "
                         "dimensions' sizes with --bind DIM=N")
    if not args.model or len(args.concurrency) != 1:
        raise PrismError("prism bench MODEL --devices SPEC takes one --concurrency; "
                         "or give --url URL to load a server")
    args.concurrency = args.concurrency[0]
    devices = run_devices(args)
    options = load_options(args)
    name = Path(args.model).stem
    feeds = given_inputs(args, options)
    with HostManager(devices, max_queue=max(100, 4 * args.concurrency),
                     max_active=max(2, args.concurrency)) as host:
        add_network_measuring(host, plain_console(stderr=True), name, args.model, **options)
        graph = host.graph(name)
        load = LoadGenerator(host, name, concurrency=args.concurrency, requests=args.requests,
                             bindings=options["bindings"], feeds=feeds)
        rate = load.measure()
    threads = sum(d.threads for d in devices if d.backend == "cpu") or 1
    plain = plain_onnxruntime(graph, args.concurrency, args.requests, threads,
                              options["bindings"], feeds)
    figures = {"prism": _figures(rate, load.stats.latencies),
               "onnxruntime": _figures(*plain), "onnxruntime_threads": threads,
               "clients": args.concurrency, "requests": args.requests}
    figures["ratio"] = (figures["prism"]["requests_per_second"]
                        / figures["onnxruntime"]["requests_per_second"])
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    table = Table(title=f"{name}: {args.concurrency} clients, {args.requests} requests",
                  box=box.SIMPLE_HEAD)
    for col in ("runtime", "req/s", "p50", "p99"):
        table.add_column(col, justify="left" if col == "runtime" else "right")
    for label, key in ((f"Prism on {args.devices}", "prism"),
                       (f"onnxruntime, {threads} thread(s)", "onnxruntime")):
        f = figures[key]
        table.add_row(label, f"{f['requests_per_second']:.0f}", human_seconds(f["p50_seconds"]),
                      human_seconds(f["p99_seconds"]))
    console = plain_console()
    console.print(table)
    console.print(Text.assemble("Prism / onnxruntime throughput: ",
                                (f"{figures['ratio']:.2f}x", "bold")))
    return 0
