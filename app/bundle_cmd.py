"""`prism compile` (a model to a bundle) and `prism export-onnx` (a bundle's network to
one ONNX file whose nodes say where they run)."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from rich import box
from rich.table import Table

from app.arguments import network_options
from app.console import plain_console
from app.given_inputs import given_inputs
from app.measuring import measuring
from runtime.bundle.contents import export_onnx
from runtime.bundle.writer import Compiled, compile_bundle
from runtime.devices import parse_devices
from runtime.units import human_bytes, human_seconds


def schedule_table(compiled: Compiled) -> Table:
    """The bundle's schedule: one row per partition, in the order a serial run takes."""
    m = compiled.manifest
    table = Table(title=f"{m['network']}: {m['mode']} plan, {len(m['schedule'])} partitions",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in ("part", "device", "nodes", "reads", "writes", "after", "weights", "compute",
                "optimized"):
        table.add_column(col, justify="right" if col in ("nodes", "weights", "compute")
                         else "left", no_wrap=col != "after")
    for row, part in zip(m["schedule"], compiled.plan.partitions, strict=True):
        table.add_row(row["partition"], row["device"], str(len(part.nodes)),
                      str(len(row["reads"])), str(len(row["writes"])),
                      ", ".join(row["after"]) or "-", human_bytes(part.weight_bytes),
                      human_seconds(part.est_seconds), row["optimization"])
    return table


def summary_lines(compiled: Compiled) -> list[str]:
    m, w = compiled.manifest, compiled.manifest["weights"]
    made = m["created_with"]
    shared = Counter(n for r in m["requirements"] for n in [r["device"]])
    return [
        f"wrote {compiled.path} ({human_bytes(compiled.size)}): {len(m['schedule'])} "
        f"partitions on {len(shared)} devices, bottleneck "
        f"{human_seconds(compiled.plan.bottleneck_seconds)} per request",
        f"weights: {human_bytes(w['bytes'])} stored for {human_bytes(w['referenced_bytes'])} "
        f"referenced ({w['tensors']} distinct tensors, each once)",
        f"made with prism {made['prism']}, onnx {made['onnx']}, onnxruntime "
        f"{made['onnxruntime']}; run it with runtime.driver.open_bundle",
    ]


def compile_command(args: argparse.Namespace) -> int:
    options = network_options(args)
    devices = parse_devices(args.devices)
    given_inputs(args, options)
    with measuring(plain_console(stderr=True)) as report:
        compiled = compile_bundle(args.model, devices, args.output,
                                  name=Path(args.model).stem, on_progress=report, **options)
    if args.json:
        print(json.dumps({"path": str(compiled.path), "bytes": compiled.size,
                          **compiled.manifest}, indent=2))
        return 0
    console = plain_console()
    console.print(schedule_table(compiled))
    for line in summary_lines(compiled):
        console.print(line, highlight=False)
    return 0


def export_command(args: argparse.Namespace) -> int:
    model = export_onnx(args.bundle, args.output)
    parts = Counter(next(p.value for p in n.metadata_props if p.key == "prism.partition")
                    for n in model.graph.node)
    plain_console().print(f"wrote {args.output}: {len(model.graph.node)} nodes in {len(parts)} "
                    f"partitions, each node's partition and device in its metadata "
                    f"(prism.partition, prism.device)", highlight=False)
    return 0
