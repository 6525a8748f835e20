"""`prism partition`: print a plan as a table (or JSON), optionally every step."""

from __future__ import annotations

import argparse
import json

from rich import box
from rich.table import Table
from rich.text import Text

from app.arguments import load, mode_and_map, output_file, writing
from app.console import plain_console
from app.given_inputs import graph_given_inputs
from app.measuring import measuring
from runtime.errors import PrismError
from runtime.graph import Graph
from runtime.partition import Plan
from runtime.partition.memory_plan import DeviceMemoryPlan, memory_plans, memory_plans_dict
from runtime.partition.planning import plan_network
from runtime.units import human_bytes, human_seconds


def plan_table(plan: Plan) -> Table:
    table = Table(title=f"{plan.network}: {plan.mode} plan, {len(plan.partitions)} partitions "
                        f"({plan.costs} costs)",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in ("part", "device", "nodes", "weights", "activ.", "compute", "copy in",
                "copy out", "in", "out"):
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
                      human_seconds(p.transfer_out_seconds) if p.transfer_out_seconds else "-",
                      human_bytes(bytes_in[p.name]), human_bytes(bytes_out[p.name]))
    return table


def copies_table(plan: Plan) -> Table:
    table = Table(title="copies between devices (per request)", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for col in ("tensor", "from", "to", "bytes", "time"):
        table.add_column(col, justify="right" if col in ("bytes", "time") else "left")
    for t in plan.transfers:
        table.add_row(t.tensor, f"{t.src_partition}@{t.src}",
                      f"{','.join(t.dst_partitions)}@{t.dst}", human_bytes(t.bytes),
                      human_seconds(t.est_seconds))
    return table


def memory_plan_table(mp: DeviceMemoryPlan) -> Table:
    """One device's activation tensors: where each sits in the arena and when it is live."""
    table = Table(title=f"memory plan {mp.device} (peak {human_bytes(mp.peak_bytes)})",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in ("tensor", "partition", "storage", "offset", "size", "first", "last"):
        table.add_column(col, justify="left" if col in ("tensor", "partition") else "right")
    for e in sorted(mp.entries, key=lambda e: (e.start, e.offset, e.tensor)):
        table.add_row(e.tensor, ",".join(e.partitions) or e.partition, str(e.storage_id),
                      str(e.offset), str(e.size), str(e.start), str(e.end))
    return table


def memory_peaks_table(plans: dict[str, DeviceMemoryPlan]) -> Table:
    table = Table(title="activation memory per device (per request)", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for col in ("device", "tensors", "blocks", "peak bytes", "arena bytes", "without reuse"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for device, mp in plans.items():
        table.add_row(device, str(len(mp.entries)), str(mp.storage_blocks), str(mp.peak_bytes),
                      str(mp.arena_bytes), str(mp.total_tensor_bytes))
    return table


def explain(plan: Plan, graph: Graph, node: str) -> str:
    """Where NODE went and why, in one paragraph."""
    if node not in graph.by_name:
        raise PrismError(f"--explain: no node named {node!r} in {graph.name}")
    op = graph.node(node).op_type
    part = plan.partition_of(node)
    return f"{node} ({op}) -> {part.name} on {part.device}: {plan.reasons.get(node, '')}"


def run(args: argparse.Namespace) -> int:
    console = plain_console()
    mode, user_map = mode_and_map(args.partition)
    dot = output_file(args.dot, "--dot") if args.dot else None
    graph, devices = load(args)
    graph, feeds = graph_given_inputs(args, graph, graph.bindings or None)
    with measuring(plain_console(stderr=True)) as progress:
        steps, plan = plan_network(graph, devices, user_map or mode, annotations=args.annotate,
                                   fallback=args.fallback, costs=args.costs,
                                   on_progress=progress, sample_feeds=feeds)
    if args.steps and not args.json:
        for step in steps:
            console.print(Text.assemble((f"{step.index:>5}", "dim"),
                                        f" {step.kind:<8} {step.reason}"))
    if dot:
        writing(dot, "--dot", lambda: dot.write_text(plan.to_dot(graph)))
    memory_plan = getattr(args, "memory_plan", False)
    if args.json:
        if memory_plan:
            print(json.dumps({**plan.to_dict(), "memory_plans": memory_plans_dict(
                memory_plans(plan, graph))}, indent=2))
        else:
            print(plan.to_json())
        return 0
    console.print(plan_table(plan))
    if plan.transfers:
        console.print(copies_table(plan))
    if memory_plan:
        plans = memory_plans(plan, graph)
        for mp in plans.values():
            if mp.entries:
                console.print(memory_plan_table(mp))
        console.print(memory_peaks_table(plans))
    for node in args.explain:
        console.print(explain(plan, graph, node))
    console.print(Text.assemble(
        "bottleneck: ", (human_seconds(plan.bottleneck_seconds), "bold"),
        f" per request (busiest device), {len(plan.transfers)} copies between devices, "
        f"{human_bytes(sum(t.bytes for t in plan.transfers))} per request"))
    console.print(Text.assemble(
        "lower bound: ", (human_seconds(plan.lower_bound_seconds), "bold"),
        f" (no split over these devices beats it); this plan is {plan.gap:.0%} above it"))
    return 0
