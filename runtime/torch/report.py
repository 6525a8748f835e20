"""What the backend decided for one captured graph: its blocks, each node offloaded or
kept in PyTorch (and why), each block's networks and their plans over the devices.

Records only: no torch here, so a report can be read, printed and serialized anywhere.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.partition.plan import Plan

WAITING = "waiting for its first call"


@dataclass
class NodeRecord:
    """One ATen operator of the graph: in a block (reason None) or kept, and why."""

    name: str
    op: str
    block: str | None = None
    reason: str | None = None

    @property
    def offloaded(self) -> bool:
        return self.block is not None and self.reason is None


@dataclass
class VariantRecord:
    """One export of a block: its network on the host, what it takes, how it was placed."""

    network: str
    inputs: dict[str, list[int | None]]
    export_seconds: float
    plan: Plan | None = None
    loaded: bool = True  # on the host; a dry run only plans

    def placed(self) -> str:
        if self.plan is None:
            return "not planned"
        parts = ", ".join(f"{p.name} on {p.device} ({len(p.nodes)} nodes)"
                          for p in self.plan.partitions)
        return f"{parts}; bottleneck {self.plan.bottleneck_seconds * 1e6:.0f} us"

    def to_dict(self) -> dict[str, Any]:
        return {"network": self.network, "loaded": self.loaded, "inputs": self.inputs,
                "export_seconds": round(self.export_seconds, 4),
                "plan": None if self.plan is None else self.plan.to_dict()}


@dataclass
class BlockRecord:
    name: str
    nodes: list[str]
    state: str = WAITING
    variants: list[VariantRecord] = field(default_factory=list)
    parent: str | None = None  # the block it was split out of, if any

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": self.nodes, "state": self.state,
                "parent": self.parent, "variants": [v.to_dict() for v in self.variants]}


@dataclass
class GraphReport:
    """The report of one graph dynamo captured (after AOT autograd lowered it to ATen)."""

    name: str
    devices: list[str]
    dry_run: bool = False
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    blocks: dict[str, BlockRecord] = field(default_factory=dict)

    def kept(self, names: list[str], reason: str) -> None:
        """Nodes that were in a block now run in PyTorch, for `reason`."""
        for name in names:
            if name in self.nodes:
                self.nodes[name].reason = reason

    @property
    def offloaded(self) -> list[NodeRecord]:
        return [n for n in self.nodes.values() if n.offloaded]

    @property
    def kept_nodes(self) -> list[NodeRecord]:
        return [n for n in self.nodes.values() if not n.offloaded]

    @property
    def networks(self) -> list[str]:
        """The networks its blocks added to the host."""
        return [v.network for b in self.blocks.values() for v in b.variants if v.loaded]

    def summary(self) -> str:
        live = [b for b in self.blocks.values() if b.variants or b.state == WAITING]
        return (f"{self.name}: {len(self.offloaded)} of {len(self.nodes)} operators "
                f"offloaded in {len(live)} block{'s' * (len(live) != 1)} over "
                f"{', '.join(self.devices)}" + (" (dry run)" if self.dry_run else ""))

    def reasons(self) -> Counter[tuple[str, str]]:
        """(operator, reason) -> how many nodes stay in PyTorch for it."""
        return Counter((n.op, n.reason or "outside any block") for n in self.kept_nodes)

    def table(self) -> str:
        """The report as text: a line per block and per operator kept in PyTorch."""
        lines = [self.summary()]
        for block in self.blocks.values():
            lines.append(f"  block {block.name}: {len(block.nodes)} operators, {block.state}")
            for variant in block.variants:
                shapes = ", ".join(f"{k}{list(v)}" for k, v in variant.inputs.items())
                lines.append(f"    {variant.network} ({shapes}): {variant.placed()}")
        if self.kept_nodes:
            lines.append("  kept in PyTorch:")
            for (op, reason), count in sorted(self.reasons().items()):
                lines.append(f"    {op} x{count}: {reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"graph": self.name, "devices": self.devices, "dry_run": self.dry_run,
                "operators": len(self.nodes), "offloaded": len(self.offloaded),
                "blocks": [b.to_dict() for b in self.blocks.values()],
                "nodes": [{"name": n.name, "op": n.op, "block": n.block,
                           "offloaded": n.offloaded, "reason": n.reason}
                          for n in self.nodes.values()]}
