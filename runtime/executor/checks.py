"""What a device returned, checked against what its partition declares.

A device may be another process, or a kernel with a bug: before the executor hands a
partition's results on, each declared output must be there, an array of its declared
dtype and rank with its fixed dimensions (a symbolic one takes any size). This runs on
every stage of every request, so it is cheap: a shape seen before costs one set lookup
(`InputSpec.accepts`). Sequences and optionals are only looked for, as the backend made
them. A graph output's declared shape is a hint, as onnxruntime reads it (it warns and
answers): CatBoost declares a regressor's predictions [N] and its trees make [N, 1].
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from runtime.devices.remote import RemoteValue
from runtime.inputs import InputSpec, ValueType, array_text, tensor_specs

if TYPE_CHECKING:
    from runtime.graph import Graph

_MISSING = object()
ANY = ValueType("value")  # a type `_problem` only looks for


class OutputCheck:
    __slots__ = ("expected", "specs")

    def __init__(self, specs: Iterable[InputSpec]):
        self.specs = tuple(specs)
        # (name, dtype, shapes seen) per output: the short pass reads only these
        self.expected = tuple((s.name, s.dtype, s.shapes_seen) for s in self.specs)

    @classmethod
    def of(cls, graph: Graph, names: Iterable[str]) -> OutputCheck:
        """As the graph declares the tensors `names`, a graph output of any shape."""
        outputs = set(graph.outputs)
        return cls(replace(s, dims=None) if s.name in outputs else s
                   for s in tensor_specs(graph, names))

    @classmethod
    def names(cls, names: Iterable[str]) -> OutputCheck:
        """Only that each output is there (what a bundle's manifest can tell: it keeps no
        types of the tensors between partitions, so a sequence passes as a tensor does)."""
        return cls(InputSpec(name, None, None, ANY) for name in names)

    def problem(self, outputs: object) -> str | None:
        """None when every declared output is there as declared, else what is wrong."""
        if type(outputs) is dict:  # the usual case, every output as seen before
            for name, dtype, seen in self.expected:
                value = outputs.get(name)
                if type(value) is not np.ndarray or value.shape not in seen or (
                        value.dtype is not dtype and dtype is not None and value.dtype != dtype):
                    return self._problem(outputs)
            return None
        return self._problem(outputs)

    def _problem(self, outputs: object) -> str | None:
        if type(outputs) is not dict and not isinstance(outputs, Mapping):
            return f"returned {type(outputs).__name__}, not outputs by name"
        for spec in self.specs:
            value = outputs.get(spec.name, _MISSING)
            if type(value) is np.ndarray and spec.accepts(value):
                continue
            if value is _MISSING:
                return f"output {spec.name!r} is missing"
            if spec.type is not None:
                continue
            if isinstance(value, RemoteValue) and value.shape is not None and \
                    spec.accepts(value):  # type: ignore[arg-type]  # dtype and shape, as
                continue  # its device reported them: all `accepts` reads
            if not isinstance(value, np.ndarray):
                return f"output {spec.name!r} is a {type(value).__name__}, declared " \
                       f"{spec.describe()}"
            if value.dtype.kind in "US":  # numpy's fixed-width text (the reference
                value = value.astype(object)  # evaluator's) for an ONNX string tensor
            if not spec.accepts(value):
                return f"output {spec.name!r} is {array_text(value)}, declared " \
                       f"{spec.describe()}"
        return None
