"""`prism partition`: print a plan as a table (or JSON), optionally every step."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from app.loading import load, mode_and_map
from runtime.partition import Plan, partition_steps
from runtime.partition.record import finish, tap
from runtime.units import human_bytes, human_seconds


def plan_table(plan: Plan) -> Table:
    table = Table(title=f"{plan.network}: {plan.mode} plan, {len(plan.partitions)} partitions",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in ("part", "device", "nodes", "weights", "activ.", "compute", "copy in", "in",
                "out"):
        table.add_column(col, justify="left" if col in ("part", "device") else "right",
                         no_wrap=True)
    bytes_in = {p.name: 0 for p in plan.partitions}
    bytes_out = dict(bytes_in)
    for t in plan.transfers:
        bytes_out[t.src_partition] += t.bytes
        bytes_in[min(t.dst_partitions, key=[p.name for p in plan.partitions].index)] += t.bytes
    for p in plan.partitions:
        table.add_row(p.name, p.device, str(len(p.nodes)), human_bytes(p.weight_bytes),
                      human_bytes(p.activation_bytes), human_seconds(p.est_seconds),
                      human_seconds(p.transfer_in_seconds) if p.transfer_in_seconds else "-",
                      human_bytes(bytes_in[p.name]), human_bytes(bytes_out[p.name]))
    return table


def run(args: argparse.Namespace) -> int:
    console = Console()
    mode, user_map = mode_and_map(args.partition)
    graph, devices = load(args)
    steps = partition_steps(graph, devices, mode, user_map=user_map)
    if args.steps and not args.json:
        steps = tap(steps, lambda step: console.print(
            f"[dim]{step.index:>5}[/] {step.kind:<8} {step.reason}", highlight=False))
    plan = finish(steps)
    if args.dot:
        Path(args.dot).write_text(plan.to_dot(graph))
    if args.json:
        print(plan.to_json())
        return 0
    console.print(plan_table(plan))
    console.print(f"bottleneck: [bold]{human_seconds(plan.bottleneck_seconds)}[/] per request "
                  f"(busiest device), {len(plan.transfers)} copies between devices, "
                  f"{human_bytes(sum(t.bytes for t in plan.transfers))} per request")
    return 0
