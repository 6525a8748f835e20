"""Placement: which devices may run each node, and why, before any partitioning mode.

Precedence (after TVM's annotations, without Glow's dependence on device order):
a node-name annotation, then an op-type annotation, then every device able to run the
node ("cheapest": the mode picks among them by the cost model). A node whose preferred
device cannot run it goes to the fallback device; if that cannot either, placement
fails at once naming the node, its op, what was asked for and what could run it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.devices.backends import checks_nodes, node_problem, supported_ops
from runtime.devices.config import BACKENDS, DeviceConfig
from runtime.errors import PartitionError
from runtime.graph import Graph, Node
from runtime.onnx_kinds import DEFAULT_DOMAINS
from runtime.precision import node_precisions


@dataclass(frozen=True)
class Annotations:
    """node name -> device or kind; op type -> device or kind; a fallback device.

    `names` holds a flat map's keys (TVM's op -> device form), each a node name or an op
    type: only the graph can tell which, so `place` resolves them, a node name first."""

    nodes: Mapping[str, str] = field(default_factory=dict)
    ops: Mapping[str, str] = field(default_factory=dict)
    fallback: str | None = None
    names: Mapping[str, str] = field(default_factory=dict)
    label: str = "annotations"  # "annotations FILE" when read from a file, for errors

    @property
    def empty(self) -> bool:
        return not self.nodes and not self.ops and not self.names and self.fallback is None

    def resolved(self, graph: Graph) -> Annotations:
        """`names` sorted into nodes and op types of `graph`; a name that is neither fails."""
        if not self.names:
            return self
        ops = {n.op_type for n in graph.nodes}
        nodes = set(graph.by_name) | set(graph.folded.nodes)
        neither = sorted(set(self.names) - nodes - ops)
        if neither:
            raise PartitionError(f"{self.label} name neither a node nor an op type of "
                                 f"{graph.name}: {', '.join(neither[:5])}")
        return Annotations({**{k: v for k, v in self.names.items() if k in nodes}, **self.nodes},
                           {**{k: v for k, v in self.names.items() if k not in nodes},
                            **self.ops}, self.fallback, label=self.label)


def read_annotations(source: str | Path | Mapping | Annotations | None,
                     fallback: str | None = None) -> Annotations:
    """From a dict or TOML file: `fallback = "cpu0"`, `[nodes]`, `[ops]` tables, and any
    other `name = "device or kind"` naming a node or an op type."""
    table: dict[str, Any]
    if isinstance(source, Annotations):
        table = {"nodes": source.nodes, "ops": source.ops, "fallback": source.fallback,
                 **source.names}
    elif source is None:
        table = {}
    elif isinstance(source, Mapping):
        table = dict(source)
    else:
        path = Path(source)
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise PartitionError(f"cannot read annotations {path}: {exc}") from None
    label = source.label if isinstance(source, Annotations) else "annotations" \
        if isinstance(source, Mapping | None) else f"annotations {source}"
    names = {k: v for k, v in table.items() if k not in ("nodes", "ops", "fallback")}
    unknown = [k for k, v in names.items() if not isinstance(k, str) or not isinstance(v, str)]
    if unknown:
        raise PartitionError(f"{label}: unknown key(s) {sorted(map(str, unknown))}; use "
                             f"[nodes], [ops], fallback, or name = \"device or kind\"")
    fallback = fallback or table.get("fallback")
    if fallback is not None and not isinstance(fallback, str):
        raise PartitionError(f"{label}: fallback must be a device name, got {fallback!r}")
    return Annotations(_names_to_targets(table, "nodes", label),
                       _names_to_targets(table, "ops", label), fallback, names, label)


def _names_to_targets(table: Mapping, key: str, label: str) -> dict[str, str]:
    """`[nodes]` or `[ops]`: names to device names or kinds, all strings."""
    value = table.get(key) or {}
    if not isinstance(value, Mapping):
        raise PartitionError(f"{label}: {key} must be a table of name = \"device or kind\", "
                             f"got {type(value).__name__} {value!r:.40}")
    for name, target in value.items():
        if not isinstance(target, str):
            raise PartitionError(f"{label}: {key}.{name} must name a device or kind, "
                                 f"got {target!r:.40}")
    return dict(value)


def can_run(device: DeviceConfig, node: Node, graph: Graph | None = None) -> bool:
    """The backend's op list narrowed by the device's own `supported_ops`; with the node's
    graph, also the backend's check of the node in its model (opset, types, domain)."""
    return unsupported(device, node, graph) is None


def unsupported(device: DeviceConfig, node: Node, graph: Graph | None = None) -> str | None:
    """Why `device` cannot run `node`, or None if it can. A node with subgraphs (If, Loop,
    Scan) runs their nodes too: each must be in the op lists as well."""
    if not device.can_run(node.op_type):
        return f"{node.op_type} is not in the device's op list"
    lacking = [op for _, op in node.body_ops if not device.can_run(op)]
    if lacking:
        return f"its body runs {lacking[0]}, which is not in the device's op list"
    precision = node_precisions(graph).get(node.name) if graph is not None else None
    if device.precisions is not None and precision not in (None, *device.precisions):
        return f"it computes in {precision}; the device runs {'+'.join(sorted(device.precisions))}"
    ops = supported_ops(device.backend)
    lacking = [op for domain, op in node.body_ops
               if domain in DEFAULT_DOMAINS and ops is not None and op not in ops]
    if lacking:
        return f"its body runs {lacking[0]}; {device.backend} has none"
    if node.domain in DEFAULT_DOMAINS:
        if ops is not None and node.op_type not in ops:
            return f"{device.backend} has no {node.op_type}"
    elif graph is None or not checks_nodes(device.backend):
        # custom domains: onnxruntime's own kernels, else the device's op list
        if device.backend != "cpu" and (device.supported_ops is None
                                        or node.op_type not in device.supported_ops):
            return f"{device.backend} runs no {node.domain}.{node.op_type}"
        return None
    return None if graph is None else node_problem(device.backend, node, graph)


@dataclass
class Placement:
    allowed: dict[str, frozenset[str]]  # node -> device names it may run on
    reasons: dict[str, str]

    @property
    def unconstrained(self) -> bool:
        names = set().union(*self.allowed.values()) if self.allowed else set()
        return all(a == names for a in self.allowed.values())


def confined_groups(graph: Graph, allowed: Mapping[str, frozenset[str]], names: Iterable[str]
             ) -> list[tuple[frozenset[str], list[Node]]]:
    """Each set of the devices `names` that placement allows some node, short of all of
    them, with the nodes allowed only within it; the sets in a fixed order."""
    every = frozenset(names)
    groups = {a & every for a in allowed.values()} - {every, frozenset()}
    return [(group, [n for n in graph.nodes if allowed.get(n.name, every) <= group])
            for group in sorted(groups, key=sorted)]


def _names(names: Iterable[str]) -> str:
    """Device names for a message, sorted: the same words whatever order devices came in."""
    return ", ".join(sorted(names))


def _targets(what: str, devices: Sequence[DeviceConfig], where: str, node: Node,
             capable: Sequence[str]) -> list[str]:
    named = [d.name for d in devices if d.name == what]
    if named:
        return named
    kind = [d.name for d in devices if d.backend == what]
    if kind:
        return kind
    if what not in BACKENDS:
        raise PartitionError(f"annotation {where} names {what!r}, which is not a device "
                             f"(devices: {_names(d.name for d in devices)})")
    could = (f"node {node.name} ({node.op_type}) can run on {_names(capable)}" if capable
             else f"no device here can run node {node.name} ({node.op_type})")
    raise PartitionError(f"annotation {where} names {what!r}, which is a kind with no device "
                         f"here; {could}")


def place(graph: Graph, devices: Sequence[DeviceConfig], notes: Annotations) -> Placement:
    notes = notes.resolved(graph)
    by_name = {d.name: d for d in devices}
    if notes.fallback is not None and notes.fallback not in by_name:
        raise PartitionError(f"fallback device {notes.fallback!r} is not among the devices "
                             f"({_names(by_name)})")
    missing = sorted(set(notes.nodes) - set(graph.by_name) - set(graph.folded.nodes))
    if missing:
        raise PartitionError(f"{notes.label} name nodes not in {graph.name}: "
                             f"{', '.join(missing[:5])}")
    # Devices of one backend, op list and precisions answer alike: ask one of each kind, so
    # placement stays linear in the device count (thousands of twins are one question).
    kinds: dict[tuple, list[str]] = {}
    for d in devices:
        kinds.setdefault((d.backend, d.supported_ops, d.precisions), []).append(d.name)
    kind_of = {name: key for key, names in kinds.items() for name in names}
    sample = {key: by_name[names[0]] for key, names in kinds.items()}
    everyone, anywhere = frozenset(by_name), f"any device ({_names(by_name)})"
    allowed, reasons = {}, {}
    for node in graph.nodes:
        problems = {key: unsupported(d, node, graph) for key, d in sample.items()}
        capable = [n for key, names in kinds.items() if problems[key] is None for n in names]
        capable_set = everyone if len(capable) == len(by_name) else frozenset(capable)
        if node.name in notes.nodes:
            asked = notes.nodes[node.name]
            wanted = _targets(asked, devices, f"for node {node.name}", node, capable)
            why = f"annotated {asked} (node)"
        elif node.op_type in notes.ops:
            asked = notes.ops[node.op_type]
            wanted = _targets(asked, devices, f"for op {node.op_type}", node, capable)
            why = f"annotated {asked} (op {node.op_type})"
        else:
            wanted, why, asked = list(by_name), "cheapest", anywhere
        able = [d for d in wanted if d in capable_set]
        if not able:
            # what stops the wanted devices, whatever order they were listed in
            problem = "; ".join(sorted({problems[kind_of[d]] or "" for d in wanted}))
            fallback = notes.fallback
            if fallback is not None and fallback in capable_set:
                able, why = [fallback], (f"unsupported on {asked} -> fallback {fallback} "
                                         f"({problem})")
            else:
                could = _names(capable) or "none"
                raise PartitionError(f"node {node.name} ({node.op_type}) cannot run on "
                                     f"{asked}: {problem}; devices that can: {could}")
        allowed[node.name] = everyone if len(able) == len(everyone) else frozenset(able)
        reasons[node.name] = why
    return Placement(allowed, reasons)
