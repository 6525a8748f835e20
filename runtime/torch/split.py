"""An ATen graph split into blocks: the supported nodes fused into submodules (torch.fx's
capability-based partitioner), the rest left in the graph to run in eager PyTorch."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from runtime.torch.support import NodeSupport, is_size, op_label


@dataclass
class Block:
    name: str            # the submodule's name in the split graph
    module: GraphModule  # the block's own graph, which runs it in PyTorch
    nodes: list[str]     # the operators it holds


@dataclass
class Split:
    module: GraphModule        # the graph, each block now one call of a submodule
    blocks: list[Block]
    ops: dict[str, str]        # every operator node of the graph -> its operator
    reasons: dict[str, str]    # operator nodes kept in PyTorch -> why


def operators(gm: GraphModule) -> list[Node]:
    """The nodes the report counts: calls that make tensors (not tuple indexing, not the
    arithmetic on sizes a dynamic graph does in Python)."""
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and n.target is not operator.getitem
            and not isinstance(n.meta.get("val"), int | torch.SymInt | float | torch.SymFloat
                               | bool | torch.SymBool)]


def _reads_tensor(nodes: Mapping[Node, object]) -> bool:
    """Does the group read a tensor from outside itself? (One that reads none computes a
    constant: nothing to hand a device.)"""
    return any(isinstance(arg.meta.get("val"), torch.Tensor)
               for n in nodes for arg in n.all_input_nodes if arg not in nodes)


def split(gm: GraphModule, support: NodeSupport, min_block_size: int,
          prefix: str = "b") -> Split:
    """Fuse `gm`'s supported nodes into blocks named `prefix0`, `prefix1`, ... in graph
    order (the graph is changed in place). Groups of fewer than `min_block_size`
    operators, and groups that read no tensor, stay in PyTorch."""
    counted = operators(gm)
    ops = {n.name: op_label(n) for n in counted}
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    while True:  # each round keeps one more size in PyTorch: bounded by their number
        partitioner = CapabilityBasedPartitioner(gm, support,
                                                 allows_single_node_partition=True)
        groups = sorted(partitioner.propose_partitions(),
                        key=lambda p: min(position[n] for n in p.nodes))
        shared = {n.name: "a size read in two blocks" for g in groups for n in g.nodes
                  if is_size(n) and not set(n.users) <= g.nodes.keys()}
        if not shared:  # a block hands out tensors only
            break
        support.exclude(shared)
    reasons = {name: why for name, why in support.reasons.items() if name in ops}
    kept = []
    for group in groups:
        members = [n for n in group.nodes if n.target is not operator.getitem]
        if len(members) < min_block_size:
            why = (f"its block would hold {len(members)} operator"
                   f"{'s' * (len(members) != 1)}, under min_block_size {min_block_size}")
        elif not _reads_tensor(group.nodes):
            why = "computes a constant (its block reads no tensor)"
        else:
            kept.append(group)
            continue
        reasons.update({n.name: why for n in members})
    fused = fuse_by_partitions(gm, [g.nodes for g in kept], prefix=prefix,
                               always_return_tuple=True)
    blocks = []
    for i, group in enumerate(kept):
        names = [n.name for n in sorted(group.nodes, key=position.__getitem__)
                 if n.name in ops]
        blocks.append(Block(f"{prefix}{i}", getattr(fused, f"{prefix}{i}"), names))
    return Split(fused, blocks, ops, reasons)
