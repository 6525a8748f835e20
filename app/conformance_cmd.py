"""`prism conformance`: ONNX's backend test suite through Prism, onnxruntime and the
reference evaluator side by side, with a table per suite."""

from __future__ import annotations

import argparse
import json
import sys

from rich import box
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from app.conformance import RUNTIMES, SUITES, SuiteSummary, list_tests, run_suite, summarize
from app.console import plain_console
from runtime.devices import parse_devices
from runtime.errors import PrismError
from runtime.units import human_seconds

SHORT = {"prism": "prism", "onnxruntime": "ort", "reference": "ref"}


def _suites(choice: str) -> list[str]:
    return list(SUITES) if choice == "all" else [choice]


def _runtimes(text: str) -> list[str]:
    chosen = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in chosen if r not in RUNTIMES]
    if unknown or not chosen:
        raise PrismError(f"--runtimes takes a comma list of {', '.join(RUNTIMES)}; "
                         f"got {text!r}")
    return [r for r in RUNTIMES if r in chosen]


def summary_table(summaries: list[SuiteSummary], runtimes: list[str]) -> Table:
    table = Table(title="ONNX backend test suite (CPU): tests passed, and time taken",
                  box=box.SIMPLE_HEAD)
    table.add_column("suite")
    table.add_column("tests", justify="right")
    for r in runtimes:
        table.add_column(SHORT[r], justify="right")
    extra = "prism" in runtimes and len(runtimes) > 1
    if extra:
        for col in ("ort, not prism", "prism only"):
            table.add_column(col, justify="right")
    table.add_column("all fail", justify="right")
    for r in runtimes:
        table.add_column(f"{SHORT[r]} time", justify="right")
    for s in summaries:
        if not s.tests and s.suite != "total":
            continue
        style = "bold" if s.suite == "total" else None
        row: list[str | Text] = [s.suite, str(s.tests),
                                 *(str(s.passed.get(r, 0)) for r in runtimes)]
        if extra:
            bugs = len(s.ort_not_prism) if "onnxruntime" in runtimes else "-"
            row += [Text(str(bugs), style="red" if bugs else ""), str(len(s.prism_only))]
        row.append(str(len(s.all_fail)))
        row += [human_seconds(s.seconds.get(r, 0.0)) for r in runtimes]
        table.add_row(*row, style=style)
    return table


def run(args: argparse.Namespace) -> int:
    if args.devices:
        parse_devices(args.devices)  # a bad spec fails here, before any test runs
    runtimes = _runtimes(args.runtimes)
    suites = _suites(args.suite)
    console = plain_console(stderr=args.json, width=None if sys.stdout.isatty() else 150)
    tests = list_tests(suites, args.k)
    if not tests:
        raise PrismError(f"no test in {', '.join(suites)} matches {args.k!r}")
    results = []
    progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                        MofNCompleteColumn(), TextColumn("prism {task.fields[prism]} fail"),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                        transient=args.json)
    failed = 0
    with progress:
        task = progress.add_task("conformance", total=len(tests), prism=0)
        for result in run_suite(tests, runtimes, devices=args.devices, timeout=args.timeout):
            results.append(result)
            prism = result.outcomes.get("prism")
            failed += prism is not None and not prism.ok
            progress.update(task, advance=1, prism=failed,
                            description=f"{result.test.suite}: {result.test.name[:40]:<40}")
    summaries = summarize(results, suites)
    if args.json:
        json.dump({"runtimes": runtimes, "devices": args.devices,
                   "suites": [s.to_dict() for s in summaries],
                   "tests": [{"suite": r.test.suite, "name": r.test.name,
                              **{k: {"ok": o.ok, "seconds": round(o.seconds, 4),
                                     "error": o.error} for k, o in r.outcomes.items()}}
                             for r in results]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    console.print(summary_table(summaries, runtimes))
    total = summaries[-1]
    if "prism" in runtimes and "onnxruntime" in runtimes and total.ort_not_prism:
        console.print(Text("passed by onnxruntime, failed by Prism:", style="red"))
        errors = {r.test.name: r.outcomes["prism"].error for r in results}
        for name in total.ort_not_prism:
            console.print(f"  {name}: {errors[name]}", soft_wrap=True)
    if "prism" in runtimes and args.failures:
        for r in results:
            if not r.outcomes["prism"].ok:
                console.print(f"  {r.test.name}: {r.outcomes['prism'].error}", soft_wrap=True)
    return 0
