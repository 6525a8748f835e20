"""Graphviz DOT text of a plan for st.graphviz_chart: node level or partition level.

Colours follow `Plan.colors()` (one per device). Nodes are filled with a light tint of
their device's colour so black labels stay readable; clusters and partition boxes are
outlined in the full colour. Every edge carries the bytes one request sends along it;
tensors that cross devices go through a dashed copy node.
"""

from __future__ import annotations

import json

from app.dag import partition_edges
from runtime.graph import Graph
from runtime.partition import Plan
from runtime.units import human_bytes, human_seconds

COPY_COLOR = "#c0392b"
HEADER = [
    '  graph [fontname="Helvetica", fontsize=11, nodesep=0.25, ranksep=0.3, forcelabels=true, '
    'bgcolor="transparent"];',
    '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, '
    'penwidth=1.2, margin="0.08,0.04"];',
    '  edge [fontname="Helvetica", fontsize=9, fontcolor="#444444", color="#666666", '
    "arrowsize=0.6];",
]


def tint(color: str, amount: float = 0.6) -> str:
    """`color` (#rrggbb) mixed with white: 0 is the colour, 1 is white."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in (r, g, b))


def short_name(name: str, limit: int = 22) -> str:
    """The last two parts of a path-like node name, cut to `limit` characters, so a node
    box stays narrow (the full name is the node's tooltip)."""
    short = "/".join(name.split("/")[-2:])
    return short if len(short) <= limit else "…" + short[-(limit - 1):]


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def node_dot(plan: Plan, graph: Graph) -> str:
    """Every node, a cluster per partition coloured by device, copy nodes for transfers."""
    colors = plan.colors()
    lines = ["digraph plan {", "  rankdir=TB;", *HEADER]
    for p in plan.partitions:
        color = colors[p.device]
        label = f"{p.name} @ {p.device} · {human_bytes(p.memory_bytes)} · " \
                f"{human_seconds(p.est_seconds)}"
        lines += [f"  subgraph {_q('cluster_' + p.name)} {{",
                  f"    label={_q(label)}; color={_q(color)}; penwidth=2; style=rounded;"
                  f" fontcolor={_q(color)};"]
        for n in p.nodes:
            label = short_name(n) + "\n" + graph.node(n).op_type
            lines.append(f"    {_q(n)} [label={_q(label)}, tooltip={_q(n)}, "
                         f"fillcolor={_q(tint(color))}, color={_q(color)}];")
        lines.append("  }")
    home = {n: p for p in plan.partitions for n in p.nodes}
    copies = {(t.tensor, t.dst): f"copy:{t.tensor}->{t.dst}" for t in plan.transfers}
    for t in plan.transfers:
        label = f"copy {human_bytes(t.bytes)}\n{t.src} → {t.dst}"
        lines.append(f"  {_q(copies[t.tensor, t.dst])} [label={_q(label)}, shape=cds, "
                     f'style="filled,dashed", fillcolor="#fbeeee", color={_q(COPY_COLOR)}, '
                     f"fontcolor={_q(COPY_COLOR)}, fontsize=9];")
    drawn: set[str] = set()
    for src, dst, data in graph.dag.edges(data=True):
        local = []
        for tensor in data["tensors"]:
            dev = home[dst].device
            copy = copies.get((tensor, dev)) if home[src].device != dev else None
            if copy is None:
                local.append(tensor)
                continue
            size = _q(human_bytes(graph.tensor_bytes(tensor)))
            if copy not in drawn:
                drawn.add(copy)
                lines.append(f"  {_q(src)} -> {_q(copy)} [style=dashed, "
                             f"color={_q(COPY_COLOR)}, xlabel={size}];")
            lines.append(f"  {_q(copy)} -> {_q(dst)} [style=dashed, color={_q(COPY_COLOR)}];")
        if local:
            size = human_bytes(sum(graph.tensor_bytes(t) for t in local))
            lines.append(f"  {_q(src)} -> {_q(dst)} [xlabel={_q(size)}];")
    lines.append("}")
    return "\n".join(lines)


def with_style(dot_text: str) -> str:
    """Another DOT text with this module's fonts and spacing as defaults (its own
    attributes still win: Graphviz applies later defaults on top of earlier ones)."""
    head, _, body = dot_text.partition("\n")
    return "\n".join([head, *HEADER, body])


def partition_dot(plan: Plan, graph: Graph) -> str:
    """A box per partition, an edge per partition pair with the bytes sent per request."""
    colors = plan.colors()
    device_of = {p.name: p.device for p in plan.partitions}
    lines = ["digraph partitions {", "  rankdir=TB;", *HEADER]
    for p in plan.partitions:
        color = colors[p.device]
        label = (f"{p.name} @ {p.device}\n{len(p.nodes)} nodes · {human_bytes(p.memory_bytes)}"
                 f"\nest {human_seconds(p.est_seconds)}")
        lines.append(f"  {_q(p.name)} [label={_q(label)}, fillcolor={_q(tint(color))}, "
                     f"color={_q(color)}, penwidth=2, fontsize=11];")
    for e in partition_edges(plan, graph):
        label = human_bytes(e.bytes) + (f" ({e.tensors} tensors)" if e.tensors > 1 else "")
        crossing = device_of[e.src] != device_of[e.dst]
        style = f", style=dashed, color={_q(COPY_COLOR)}" if crossing else ""
        lines.append(f"  {_q(e.src)} -> {_q(e.dst)} [label={_q(label)}{style}];")
    lines.append("}")
    return "\n".join(lines)
