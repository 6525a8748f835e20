"""`prism profile MODEL --inputs DATA.npz -o profile.json`: Glow's first phase, the ranges
of every tensor over calibration samples (onnxruntime's calibrators)."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.progress import TaskID

from app.console import plain_console, progress_on
from runtime.graph import Graph, load_graph
from runtime.quantize import prepare, profile, read_samples


@contextlib.contextmanager
def progress_bar(quiet: bool) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar on stderr, driven by (what, done, total); silent when `quiet`."""
    bar = progress_on(plain_console(stderr=True), quiet=quiet)
    tasks: dict[str, TaskID] = {}
    with bar:
        def update(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], completed=done, total=total)
        yield update


def load_model(path: str) -> Graph:
    return load_graph(path, name=Path(path).stem)


def run(args: argparse.Namespace) -> int:
    graph = load_model(args.model)
    samples = read_samples(args.inputs, graph)
    with progress_bar(args.json) as show:
        show("preparing", 0, 1)
        prepared = prepare(args.model)
        tensors = profile(prepared, samples, args.output, args.method,
                          lambda done, total: show("calibrating", done, total))
    summary = {"model": args.model, "profile": args.output, "method": args.method,
               "samples": samples.count, "tensors": tensors}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        plain_console().print(f"profiled {tensors} tensors of {graph.name} over {samples.count} "
                        f"samples ({args.method}) -> {args.output}", highlight=False)
    return 0
