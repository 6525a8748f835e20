"""Reverse-mode differentiation of a training forward into ai.onnx nodes.

    back = differentiate(fwd, seed="train/seed")
    back.nodes, back.grads["conv1.weight"]     # the node list, each weight's gradient

The walk goes over the forward nodes last to first. A node whose outputs carry a gradient
and whose inputs need one (they depend on a weight) asks its op's rule for its inputs'
gradients; a tensor read by several nodes gets the Sum of what each gives back, written
for the node that made the tensor. `seed` is the loss's own gradient, an input, so one
graph serves a whole batch (1) and each micro-batch of one (its share of the batch).
Before anything is written every node on the way is checked for a rule: one without is
refused in one line naming the node and its op.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from runtime.errors import TrainingError
from runtime.graph import reads_of
from runtime.onnx_kinds import DEFAULT_DOMAINS
from runtime.train.emit import Emitter
from runtime.train.facts import SHAPE_ONLY
from runtime.train.forward import LOSS, TrainingForward
from runtime.train.registry import Grad, rule_for

SEED = "train/seed"
# Ops whose float outputs carry no gradient back to their inputs (steps: zero almost
# everywhere, as PyTorch has it)
NOT_DIFFERENTIABLE = SHAPE_ONLY | {"Constant", "RandomNormalLike", "RandomUniformLike",
                                   "Floor", "Ceil", "Round", "Sign", "Hardmax"}


@dataclass(frozen=True)
class Backward:
    nodes: tuple[onnx.NodeProto, ...]
    initializers: tuple[onnx.TensorProto, ...]
    origins: Mapping[str, str]  # node -> the model's node it serves
    grads: Mapping[str, str | None]  # weight -> its gradient (None: the loss ignores it)
    tensor_of: Mapping[str, str]  # each gradient tensor -> the tensor it is the gradient of


def differentiate(fwd: TrainingForward, seed: str = SEED, of: Iterable[str] | None = None
                  ) -> Backward:
    """The gradients of the weights `of` (default: every float initializer)."""
    facts = fwd.facts
    floats = {t for t, d in facts.dtypes.items() if d.kind == "f"}
    needs = _needing(fwd.nodes, set(fwd.weights if of is None else of) & floats, floats)
    active = _active(fwd.nodes, needs)
    walked = [n for n in fwd.nodes if id(n) in active]
    for node in walked:
        rule = rule_for(node.op_type) if node.domain in DEFAULT_DOMAINS else None
        if rule is None or rule.backward is None:
            op = node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"
            hint = {"If": " (an If trains where the shapes, not the data, decide its "
                          "condition)",
                    "Loop": " (a Loop trains where the shapes, not the data, decide how "
                            "often it runs)"}.get(op, "")
            raise TrainingError(f"node {node.name} ({op}) has no gradient rule{hint}; "
                                f"{fwd.name} cannot be trained")
    e = Emitter(fwd.opset, prefix="grad")
    producer = {o: n for n in fwd.nodes for o in n.output if o}
    first_reader: dict[str, str] = {}
    for node in fwd.nodes:
        for t in reads_of(node):
            first_reader.setdefault(t, fwd.origins[node.name])
    parts: dict[str, list[str]] = {LOSS: [seed]}
    done: dict[str, str | None] = {}
    tensor_of: dict[str, str] = {}

    def total(tensor: str) -> str | None:
        """The gradient of `tensor`: its one part, or the Sum of its parts."""
        if tensor not in done:
            got = parts.pop(tensor, [])
            origin = fwd.origins[producer[tensor].name] if tensor in producer \
                else first_reader.get(tensor, "")
            with e.serving(origin):
                grad = None if not got else got[0] if len(got) == 1 else e.op("Sum", got)
            if grad is not None:
                tensor_of[grad] = tensor
            done[tensor] = grad
        return done[tensor]

    for node in reversed(walked):
        douts = [total(o) if o in floats else None for o in node.output]
        if all(d is None for d in douts):
            continue
        with e.serving(fwd.origins[node.name]):
            douts = [_zeros(e, facts.shape(o), facts.dtype(o)) if d is None and o in floats
                     else d for o, d in zip(node.output, douts, strict=True)]
            wants = [bool(i) and i in needs for i in node.input]
            rule = rule_for(node.op_type)
            assert rule is not None and rule.backward is not None
            given = rule.backward(Grad(node, facts, e, douts, wants))
        for i, g in given.items():
            if wants[i] and g is not None:
                parts.setdefault(node.input[i], []).append(g)
                tensor_of[g] = node.input[i]
    grads = {w: total(w) for w in fwd.weights}
    return Backward(tuple(e.nodes), tuple(e.initializers.values()), dict(e.origins), grads,
                    tensor_of)


def _needing(nodes: tuple[onnx.NodeProto, ...], weights: set[str], floats: set[str]
             ) -> set[str]:
    """Float tensors whose values depend on a weight through differentiable ops."""
    needs = set(weights)
    for node in nodes:
        if node.op_type not in NOT_DIFFERENTIABLE and any(i in needs for i in reads_of(node)):
            needs.update(o for o in node.output if o in floats)
    return needs


def _active(nodes: tuple[onnx.NodeProto, ...], needs: set[str]) -> set[int]:
    """Nodes (by id) the gradient flows through: they read a tensor needing a gradient and
    the loss depends on what they write."""
    reaches = {LOSS}
    active: set[int] = set()
    for node in reversed(nodes):
        reads = reads_of(node)
        if any(o in reaches for o in node.output) and any(i in needs for i in reads):
            active.add(id(node))
            reaches.update(i for i in reads if i in needs)
    return active


def _zeros(e: Emitter, shape: tuple[int, ...], dtype: np.dtype) -> str:
    return e.expand(e.const(0, dtype), shape)
