"""`user` mode: a node -> partition map from a TOML or JSON file (or a dict).

    default = "p0"                 # where unmapped nodes go
    [partitions]                   # partition -> device; omit to use device names
    p0 = "cpu0"
    p1 = "cpu1"
    [nodes]
    "block2/conv1" = "p1"
    "head/fc" = "p1"               # or flat, outside any table, as `--annotate` takes it

A node the map does not name goes where the op it belongs to goes, not to the default: a
QuantizeLinear with its producer; a DequantizeLinear, or a node of weights alone (a tied
weight's transpose that training reads again, `train.owners`), with its first reader. A
map written for a float model places its quantized twin's groups whole, and each reader
of a dequantize node has its own at load (`runtime.dequantize`), named by no map.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.graph import Graph
from runtime.partition.plan import MODES
from runtime.partition.record import Recorder, Steps
from runtime.precision import DEQUANTIZE_OPS, QUANTIZE_OPS

Groups = list[tuple[str, str, list[str]]]


def read_user_map(source: str | Path | Mapping) -> dict:
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if not path.is_file():
        if isinstance(source, Path) or path.suffix in (".toml", ".json"):
            raise PartitionError(f"partition map not found: {path}")
        modes = ", ".join(m for m in MODES if m != "user")
        raise PartitionError(f"partition {source!r} is neither a mode ({modes}) nor a map "
                             f"file (no file {path})")
    try:
        text = path.read_text(encoding="utf-8")
        table = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise PartitionError(f"cannot read partition map {path}: {exc}") from None
    if not isinstance(table, dict):
        raise PartitionError(f"partition map {path}: expected an object of tables, got "
                             f"{type(table).__name__}")
    return table


def _strings(mapping: Mapping, key: str, what: str, *also: type) -> dict[str, Any]:
    """A `[key]` table whose values are names (or one of `also`)."""
    table = mapping.get(key) or {}
    if not isinstance(table, Mapping):
        raise PartitionError(f"partition map: {key} must be a table, got "
                             f"{type(table).__name__} {table!r:.40}")
    for name, value in table.items():
        if not isinstance(value, (str, *also)):
            raise PartitionError(f"partition map: {key}.{name} must name {what}, "
                                 f"got {value!r:.40}")
    return dict(table)


def user_mode(graph: Graph, devices: Sequence[DeviceConfig], mapping: Mapping, order: list[str],
              rec: Recorder) -> Steps[Groups]:
    names = {d.name for d in devices}
    flat = {k: v for k, v in mapping.items() if k not in ("default", "partitions", "nodes")}
    unknown = sorted(str(k) for k, v in flat.items() if not isinstance(v, str))
    if unknown:
        raise PartitionError(f"partition map: unknown key(s) {unknown}; use default, "
                             f"[partitions], [nodes], or node = \"partition\"")
    nodes = {**flat, **_strings(mapping, "nodes", "a partition")}
    parts = {k: (v.get("device") if isinstance(v, Mapping) else v)
             for k, v in _strings(mapping, "partitions", "a device", Mapping).items()}
    default = mapping.get("default")
    if default is not None and not isinstance(default, str):
        raise PartitionError(f"partition map: default must name a partition, got {default!r:.40}")
    for part in {*nodes.values(), *([default] if default else [])}:
        parts.setdefault(part, part)
    for part, dev in parts.items():
        if dev not in names:
            raise PartitionError(f"partition map: partition {part} names device {dev!r}, "
                                 f"which is not among {sorted(names)}")
    # a node folded into a weight at load is no work: the map may still name it
    unknown = sorted(set(nodes) - set(graph.by_name) - set(graph.folded.nodes))
    if unknown:
        raise PartitionError(f"partition map names nodes not in {graph.name}: "
                             f"{', '.join(unknown[:5])}")
    groups = _group_ops(graph, nodes)
    unmapped = [n for n in order if n not in nodes and groups.get(n) not in nodes]
    if unmapped and not default:
        raise PartitionError(f"partition map leaves {len(unmapped)} nodes unmapped "
                             f"(first: {unmapped[0]}) and names no default")
    index = {part: i for i, part in enumerate(parts)}
    members: dict[str, list[str]] = {part: [] for part in parts}
    for part, dev in parts.items():
        yield rec.step("open", f"open partition {part} on {dev} (from the map)", index[part],
                       dev)
    for n in order:
        op = groups.get(n)
        # checked above: a default exists for any node the map leaves out
        part = nodes[n] if n in nodes else nodes.get(op or "", str(default))
        members[part].append(n)
        why = ("mapped" if n in nodes else f"unmapped, with {op}" if op in nodes
               else f"unmapped, default {default}")
        yield rec.step("assign", f"{n} -> {part} ({why})", index[part], parts[part], (n,))
    return [(part, str(parts[part]), m) for part, m in members.items() if m]


def _group_ops(graph: Graph, named: Mapping[str, str]) -> dict[str, str]:
    """Unnamed node -> the op whose partition it takes: a quantize node's producer; the
    first reader of a dequantize node or of a node of weights alone (a tied weight's
    transpose `owners.tie_again` made for training)."""
    position = {node.name: i for i, node in enumerate(graph.nodes)}
    out = {}
    for node in graph.nodes:
        if node.name in named:
            continue
        if node.op_type in QUANTIZE_OPS:
            op = graph.producer.get(node.inputs[0]) if node.inputs else None
        elif node.op_type in DEQUANTIZE_OPS or all(graph.is_weight(t) for t in node.inputs if t):
            readers = {c for t in node.writes for c in graph.consumers.get(t, ())}
            op = min(readers, key=position.__getitem__, default=None)
        else:
            continue
        if op is not None:
            out[node.name] = op
    return out
