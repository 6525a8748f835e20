"""`make bench`: run every benchmark, write results.json and results.md, print a table."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import (
    clients,
    cold_start,
    http_serving,
    loading,
    overhead,
    partition_speed,
    pipeline,
    plans,
    quantized,
    ray_devices,
    serving,
    torch_offload,
    training,
)

SUITES = {"partition": partition_speed.run, "overhead": overhead.run, "pipeline": pipeline.run,
          "serving": serving.run, "clients": clients.run, "quantized": quantized.run,
          "cold": cold_start.run, "load": loading.run, "http": http_serving.run,
          "ray": ray_devices.run, "training": training.run, "plans": plans.run,
          "torch": torch_offload.run}
HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description="Prism benchmarks")
    parser.add_argument("--quick", action="store_true", help="a one-minute version")
    parser.add_argument("--only", choices=sorted(SUITES), action="append")
    args = parser.parse_args()
    results = []
    for name, suite in SUITES.items():
        if not args.only or name in args.only:
            results.extend(suite(quick=args.quick))
    machine = f"{platform.machine()}, {platform.python_version()}, {platform.processor() or ''}"
    (HERE / "results.json").write_text(json.dumps({"machine": machine, "quick": args.quick,
                                                   "results": results}, indent=2))
    rows = ["| benchmark | value | target | ok | detail |", "| --- | --- | --- | --- | --- |"]
    table = Table(title=f"Prism benchmarks ({'quick' if args.quick else 'full'})")
    for col in ("benchmark", "value", "target", "ok", "detail"):
        table.add_column(col)
    for r in results:
        cells = [r["name"], f"{r['value']:.4g} {r['unit']}", r["target"],
                 "yes" if r["ok"] else "NO", r["detail"]]
        rows.append("| " + " | ".join(cells) + " |")
        table.add_row(*cells)
    (HERE / "results.md").write_text("\n".join(rows) + "\n")
    Console().print(table)


if __name__ == "__main__":
    main()
