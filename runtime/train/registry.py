"""Gradient rules, found by op type: one small module per op in `runtime/train/rules/`,
each registering itself on import (as onnx's reference evaluator keeps one file per op).

    @gradient("Relu")
    def relu(g: Grad) -> dict[int, str]:        # input index -> its gradient's name
        return {0: g.e.op("Where", [positive, g.dy(), zero])}

    @rewrite("BatchNormalization")
    def batch_norm(r: Rewriting) -> dict[str, str]:   # the node as trained, in ai.onnx ops

A `gradient` rule writes, with `g.e` (an Emitter), nodes computing each wanted input's
gradient from the outputs' gradients and the forward tensors, shaped as the input. A
`rewrite` replaces a node in the training forward (batch statistics for
BatchNormalization, the argmax indices MaxPool must also give); the gradient of what it
writes comes from the rules of the ops it wrote. It returns the statistics it updates
(initializer -> tensor holding its next value).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from runtime.train.emit import Emitter, Shape
from runtime.train.facts import Facts


@dataclass
class _NodeView:
    """One forward node as a rule sees it: its attributes, the facts, the emitter."""

    node: onnx.NodeProto
    facts: Facts
    e: Emitter

    def __post_init__(self) -> None:
        self.attrs = {a.name: helper.get_attribute_value(a) for a in self.node.attribute}

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def shape(self, name: str) -> Shape:
        return self.facts.shape(name)

    def const(self, value: Any, like: str) -> str:
        """A constant of `like`'s dtype."""
        return self.e.const(value, self.facts.dtype(like))


@dataclass
class Grad(_NodeView):
    """One forward node, as its gradient rule sees it (its facts: the training forward's)."""

    douts: list[str | None] = field(default_factory=list)  # each output's gradient, or None
    wants: list[bool] = field(default_factory=list)  # which inputs need a gradient

    def x(self, i: int = 0) -> str:
        return self.node.input[i]

    def y(self, i: int = 0) -> str:
        return self.node.output[i]

    def dy(self, i: int = 0) -> str | None:
        return self.douts[i] if i < len(self.douts) else None

    def needs(self, i: int) -> bool:
        return i < len(self.wants) and self.wants[i]

    def static(self, i: int, what: str) -> np.ndarray:
        """Input `i`'s value, which must not depend on the data."""
        return self.facts.constant(self.node.input[i], self.node, what)

    def has(self, i: int) -> bool:
        return i < len(self.node.input) and bool(self.node.input[i])


@dataclass
class Rewriting(_NodeView):
    """One forward node to rewrite for training (its facts: the model's as given): write
    nodes producing its outputs."""


Backward = Callable[[Grad], Mapping[int, str]]
Rewrite = Callable[[Rewriting], Mapping[str, str]]


@dataclass(frozen=True)
class Rule:
    op: str
    backward: Backward | None = None
    rewrite: Rewrite | None = None


_RULES: dict[str, Rule] = {}
_loaded = False


def gradient(*ops: str) -> Callable[[Backward], Backward]:
    def register(fn: Backward) -> Backward:
        for op in ops:
            old = _RULES.get(op, Rule(op))
            _RULES[op] = Rule(op, fn, old.rewrite)
        return fn
    return register


def rewrite(*ops: str) -> Callable[[Rewrite], Rewrite]:
    def register(fn: Rewrite) -> Rewrite:
        for op in ops:
            old = _RULES.get(op, Rule(op))
            _RULES[op] = Rule(op, old.backward, fn)
        return fn
    return register


def rules() -> Mapping[str, Rule]:
    """Every rule, the rule modules imported on first use."""
    global _loaded
    if not _loaded:
        package = importlib.import_module("runtime.train.rules")
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
        _loaded = True
    return _RULES


def rule_for(op_type: str) -> Rule | None:
    return rules().get(op_type)
