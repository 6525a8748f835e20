"""Graphviz DOT text: the one writer for every drawing of a plan or a graph.

Three drawings: a plan node by node (a cluster per partition, a copy node per transfer;
`Plan.to_dot`, `prism partition --dot`, the dashboards), a plan partition by partition, and
a graph whose nodes each carry their own colour (the partition stepper). Colours come from
the caller as an `Ink` per device: the runtime keeps no palette, so `Plan.to_dot` names
Graphviz's own `paired12` scheme. Drawings read an `Outline` of the graph, plain data that
can cross a process, so a dashboard attached to a server draws with the same code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from runtime.graph import Graph
from runtime.partition.memory_plan import Placed
from runtime.units import human_bytes, human_seconds

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
COPY = "#c0392b"  # copies between devices: dashed, in this colour
HEADER = (
    '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.25, ranksep=0.3, '
    'forcelabels=true, bgcolor="transparent"];',
    '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, '
    'penwidth=1.2, margin="0.08,0.04"];',
    '  edge [fontname="Helvetica", fontsize=9, fontcolor="#444444", color="#666666", '
    "arrowsize=0.6];",
)


class _Part(Placed, Protocol):
    @property
    def inputs(self) -> tuple[str, ...]: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def est_seconds(self) -> float: ...


class _Copy(Protocol):
    @property
    def tensor(self) -> str: ...
    @property
    def src(self) -> str: ...
    @property
    def dst(self) -> str: ...
    @property
    def bytes(self) -> int: ...


class Plan(Protocol):
    """A plan as a drawing reads it (a `partition.plan.Plan`): named by what it reads, since
    plan.py imports this module for `Plan.to_dot`."""

    @property
    def network(self) -> str: ...
    @property
    def partitions(self) -> Sequence[_Part]: ...
    @property
    def transfers(self) -> Sequence[_Copy]: ...


@dataclass(frozen=True)
class Ink:
    """How one device (or an unassigned node) is drawn: `line` for outlines and labels,
    `fill` light enough for black text on it."""

    line: str
    fill: str


def scheme_inks(devices: Iterable[str]) -> dict[str, Ink]:
    """Graphviz's `paired12` scheme: a light fill and a dark line of one hue per device."""
    return {d: Ink(f"/paired12/{2 * (i % 6) + 2}", f"/paired12/{2 * (i % 6) + 1}")
            for i, d in enumerate(devices)}


@dataclass(frozen=True)
class Outline:
    """What drawings and dashboards read of a graph: each node's op in graph order, each
    edge with the tensors along it, and those tensors' bytes."""

    name: str
    ops: dict[str, str]
    edges: tuple[tuple[str, str, tuple[str, ...]], ...]
    sizes: dict[str, int]

    @classmethod
    def of(cls, graph: Graph) -> Outline:
        dag = graph.dag  # edges by consumer, each one's producers in the order it reads them
        edges = tuple((src, n.name, tuple(dag.edges[src, n.name]["tensors"]))
                      for n in graph.nodes for src in dag.predecessors(n.name))
        return cls(graph.name, {n.name: n.op_type for n in graph.nodes}, edges,
                   {t: graph.tensor_bytes(t) for *_, tensors in edges for t in tensors})

    @cached_property
    def predecessors(self) -> dict[str, tuple[str, ...]]:
        return self._adjacent(backwards=True)

    @cached_property
    def successors(self) -> dict[str, tuple[str, ...]]:
        return self._adjacent(backwards=False)

    def _adjacent(self, backwards: bool) -> dict[str, tuple[str, ...]]:
        near: dict[str, list[str]] = {n: [] for n in self.ops}
        for src, dst, _ in self.edges:
            a, b = (dst, src) if backwards else (src, dst)
            near[a].append(b)
        return {n: tuple(m) for n, m in near.items()}


@dataclass(frozen=True)
class PartitionEdge:
    """Partition `src` feeds `dst` this many bytes (in this many tensors) per request."""

    src: str
    dst: str
    bytes: int
    tensors: int


def partition_edges(plan: Plan, outline: Outline) -> list[PartitionEdge]:
    """What each partition sends another per request: the tensors it makes that the other
    takes as inputs (not a weight the other makes itself as it loads)."""
    home = {n: p.name for p in plan.partitions for n in p.nodes}
    inputs = {p.name: frozenset(p.inputs) for p in plan.partitions}
    sizes: dict[tuple[str, str], dict[str, int]] = {}
    for src, dst, tensors in outline.edges:
        if home[src] != home[dst]:
            for t in tensors:
                if t in inputs[home[dst]]:
                    sizes.setdefault((home[src], home[dst]), {})[t] = outline.sizes[t]
    return [PartitionEdge(a, b, sum(ts.values()), len(ts)) for (a, b), ts in sizes.items()]


def short_name(name: str, limit: int = 22) -> str:
    """The last two parts of a path-like node name, cut to `limit` characters, so a box
    stays narrow (the full name is its tooltip)."""
    short = "/".join(name.split("/")[-2:])
    return short if len(short) <= limit else "…" + short[-(limit - 1):]


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _value(v: str | float) -> str:
    """A plain word or number as is (`style=dashed`), anything else quoted."""
    return _q(v) if isinstance(v, str) and not WORD.fullmatch(v) else str(v)


def _attrs(attrs: Mapping[str, str | float], sep: str = ", ") -> str:
    return sep.join(f"{k}={_value(v)}" for k, v in attrs.items())


def _node(name: str, **attrs: str | float) -> str:
    return f"  {_q(name)} [{_attrs(attrs)}];"


def _edge(src: str, dst: str, **attrs: str | float) -> str:
    return f"  {_q(src)} -> {_q(dst)}" + (f" [{_attrs(attrs)}];" if attrs else ";")


def plan_dot(plan: Plan, inks: Mapping[str, Ink], outline: Outline | None = None) -> str:
    """Every node in a cluster per partition, in its device's ink; a copy node per transfer;
    each edge labelled with the bytes one request sends along it (no edges without an
    outline)."""
    lines = [f"digraph {_q(plan.network)} {{", *HEADER]
    for p in plan.partitions:
        ink = inks[p.device]
        label = (f"{p.name} @ {p.device} · {human_bytes(p.memory_bytes)} · "
                 f"{human_seconds(p.est_seconds)}")
        lines += [f"  subgraph {_q('cluster_' + p.name)} {{",
                  f"    {_attrs(dict(label=label, color=ink.line, fontcolor=ink.line), '; ')}; "
                  "penwidth=2; style=rounded;"]
        for n in p.nodes:
            op = outline.ops[n] if outline is not None else ""
            lines.append("  " + _node(n, label=short_name(n) + (f"\n{op}" if op else ""),
                               tooltip=n, fillcolor=ink.fill, color=ink.line))
        lines.append("  }")
    copies = {(t.tensor, t.dst): f"copy:{t.tensor}->{t.dst}" for t in plan.transfers}
    for t in plan.transfers:
        lines.append(_node(copies[t.tensor, t.dst], label=f"copy {human_bytes(t.bytes)}\n"
                           f"{t.src} → {t.dst}", tooltip=t.tensor, shape="cds",
                           style="filled,dashed", fillcolor="#fbeeee", color=COPY,
                           fontcolor=COPY, fontsize=9))
    if outline is not None:
        lines += _plan_edges(plan, outline, copies)
    lines.append("}")
    return "\n".join(lines)


def _plan_edges(plan: Plan, outline: Outline, copies: Mapping[tuple[str, str], str]
                ) -> list[str]:
    """Edges within a device labelled with their bytes; edges across devices through the
    copy node, labelled once."""
    device = {n: p.device for p in plan.partitions for n in p.nodes}
    lines, drawn = [], set()
    for src, dst, tensors in outline.edges:
        local = []
        for tensor in tensors:
            copy = copies.get((tensor, device[dst])) if device[src] != device[dst] else None
            if copy is None:
                local.append(tensor)
                continue
            if copy not in drawn:
                drawn.add(copy)
                lines.append(_edge(src, copy, style="dashed", color=COPY,
                                   xlabel=human_bytes(outline.sizes[tensor])))
            lines.append(_edge(copy, dst, style="dashed", color=COPY))
        if local:
            size = human_bytes(sum(outline.sizes[t] for t in local))
            lines.append(_edge(src, dst, xlabel=size, tooltip=", ".join(local)))
    return lines


def partition_dot(plan: Plan, inks: Mapping[str, Ink], edges: Iterable[PartitionEdge]) -> str:
    """A box per partition, an edge per pair of partitions with the bytes sent per request;
    edges between devices dashed."""
    device = {p.name: p.device for p in plan.partitions}
    lines = [f"digraph {_q(plan.network + ' partitions')} {{", *HEADER]
    for p in plan.partitions:
        ink = inks[p.device]
        label = (f"{p.name} @ {p.device}\n{len(p.nodes)} nodes · {human_bytes(p.memory_bytes)}"
                 f"\nest {human_seconds(p.est_seconds)}")
        lines.append(_node(p.name, label=label, fillcolor=ink.fill, color=ink.line,
                           penwidth=2, fontsize=11))
    for e in edges:
        label = human_bytes(e.bytes) + (f" ({e.tensors} tensors)" if e.tensors > 1 else "")
        crossing = {"style": "dashed", "color": COPY} if device[e.src] != device[e.dst] else {}
        lines.append(_edge(e.src, e.dst, label=label, **crossing))
    lines.append("}")
    return "\n".join(lines)


def graph_dot(outline: Outline, inks: Mapping[str, Ink], default: Ink,
              tags: Mapping[str, str], shown: Collection[str] | None = None) -> str:
    """The graph node by node (only `shown` nodes and the edges among them, if given), each
    node in its own ink (`default` when it has none) with its tag after the op."""
    keep = set(outline.ops) if shown is None else set(shown)
    lines = [f"digraph {_q(outline.name)} {{", *HEADER]
    for n, op in outline.ops.items():
        if n in keep:
            ink = inks.get(n, default)
            tag = f" [{tags[n]}]" if n in tags else ""
            lines.append(_node(n, label=f"{short_name(n)}\n{op}{tag}", tooltip=n,
                               fillcolor=ink.fill, color=ink.line))
    lines += [_edge(src, dst) for src, dst, _ in outline.edges if src in keep and dst in keep]
    lines.append("}")
    return "\n".join(lines)
