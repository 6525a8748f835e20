"""What a network expects as feeds: checking given feeds, and drawing random ones."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from runtime.errors import InvalidInputError
from runtime.graph import Dim, Graph

_SHAPES_KEPT = 64  # accepted shapes remembered per input


@dataclass(frozen=True)
class InputSpec:
    """A graph input, or any tensor (`tensor_specs`). `type` is its declared ONNX type when
    it is not a plain tensor (a sequence, an optional, a map): such feeds are checked
    against it structurally."""

    name: str
    dtype: np.dtype | None
    dims: tuple[Dim, ...] | None
    type: onnx.TypeProto | None = None
    shapes_seen: set[tuple[int, ...]] = field(default_factory=set, compare=False, repr=False)

    def accepts(self, array: np.ndarray) -> bool:
        """Is `array` of this dtype and shape (a symbolic dimension takes any size)? Shapes
        accepted are remembered, so a shape seen before costs one set lookup."""
        dtype = self.dtype
        if array.shape in self.shapes_seen and (array.dtype is dtype or dtype is None):
            return True
        if (dtype is not None and array.dtype != dtype) or not _shape_ok(self.dims,
                                                                          array.shape):
            return False
        if len(self.shapes_seen) < _SHAPES_KEPT:
            self.shapes_seen.add(array.shape)
        return True

    def describe(self) -> str:
        if self.type is not None:
            return _type_text(self.type)
        dims = "?" if self.dims is None else ", ".join(
            str(d) if d is not None else "?" for d in self.dims)
        return f"{self.dtype or '?'} [{dims}]"


def _type_text(kind: onnx.TypeProto) -> str:
    which = kind.WhichOneof("value")
    if which == "tensor_type":
        return _np_dtype(kind.tensor_type.elem_type) or "tensor"
    if which == "sequence_type":
        return f"sequence of {_type_text(kind.sequence_type.elem_type)}"
    if which == "optional_type":
        return f"optional {_type_text(kind.optional_type.elem_type)}"
    return which.removesuffix("_type") if which else "value"


def _np_dtype(elem_type: int) -> str | None:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return None


def input_specs(graph: Graph) -> list[InputSpec]:
    return tensor_specs(graph, graph.inputs)


def tensor_specs(graph: Graph, names: Iterable[str]) -> list[InputSpec]:
    """Specs of any tensors by name, as declared (a partition's outputs, say)."""
    specs = []
    for name in names:
        info = graph.tensors.get(name)
        dtype = np.dtype(info.dtype) if info and info.dtype else None
        kind = graph.types.get(name)
        structured = kind is not None and kind.WhichOneof("value") != "tensor_type"
        specs.append(InputSpec(name, dtype, info.dims if info else None,
                               kind if structured else None))
    return specs


def _structured(network: str, spec: InputSpec, kind: onnx.TypeProto, value: object,
                where: str) -> object:
    """A sequence feed as a list of arrays, an optional as None or its value; each element
    checked against the declared element type where one is known."""
    which = kind.WhichOneof("value")
    if which == "optional_type":
        if value is None:
            return None
        return _structured(network, spec, kind.optional_type.elem_type, value, where)
    if which == "sequence_type":
        if not isinstance(value, list | tuple):
            raise InvalidInputError(f"input {spec.name!r} of {network}{where}: expected "
                                    f"{_type_text(kind)}, got {type(value).__name__}")
        elem = kind.sequence_type.elem_type
        return [_structured(network, spec, elem, v, f"{where}[{i}]")
                for i, v in enumerate(value)]
    if which == "tensor_type":
        array = value if type(value) is np.ndarray else np.asarray(value)
        want = _np_dtype(kind.tensor_type.elem_type)
        if want is not None and array.dtype != np.dtype(want):
            raise InvalidInputError(f"input {spec.name!r} of {network}{where}: expected "
                                    f"{want}, got {array.dtype}")
        return array
    return value  # maps and other kinds go to the backend as given


def array_text(array: np.ndarray) -> str:
    """An array's dtype and shape, as a spec is described: "float64 [2, 256]"."""
    return f"{array.dtype} [{', '.join(map(str, array.shape))}]"


def _shape_ok(dims: tuple[Dim, ...] | None, shape: tuple[int, ...]) -> bool:
    if dims is None:
        return True
    return len(dims) == len(shape) and all(
        not isinstance(d, int) or d == s for d, s in zip(dims, shape, strict=True))


def check_feeds(network: str, specs: list[InputSpec], feeds: Mapping[str, object]
                ) -> dict[str, np.ndarray]:
    """Feeds as arrays, or InvalidInputError naming the input, expected vs given."""
    if type(feeds) is not dict and not isinstance(feeds, Mapping):
        raise InvalidInputError(f"feeds for {network} must be a dict of input name -> array, "
                                f"got {type(feeds).__name__}")
    out: dict[str, Any] = {}  # arrays; lists and None for sequence and optional inputs
    for spec in specs:
        value = feeds.get(spec.name)
        if spec.type is not None and (value is not None or spec.name in feeds
                                      or spec.type.HasField("optional_type")):
            # an optional left out is an empty optional
            out[spec.name] = _structured(network, spec, spec.type, value, "")
            continue
        if value is None:
            known = {s.name for s in specs}
            extra = [k for k in feeds if k not in known]
            if extra:
                raise InvalidInputError(f"{network} has no input {extra[0]!r}; inputs are "
                                        f"{', '.join(map(repr, sorted(known)))}")
            raise InvalidInputError(f"input {spec.name!r} of {network} is missing: expected "
                                    f"{spec.describe()}")
        array = value if type(value) is np.ndarray else np.asarray(value)
        if not spec.accepts(array):
            raise InvalidInputError(f"input {spec.name!r} of {network}: expected "
                                    f"{spec.describe()}, got {array_text(array)}")
        out[spec.name] = array
    if len(feeds) != len(out) and any(k not in out for k in feeds):
        extra = sorted(k for k in feeds if k not in out)
        raise InvalidInputError(f"{network} has no input {extra[0]!r}; inputs are "
                                f"{', '.join(map(repr, sorted(out)))}")
    return out


def random_feeds(specs: list[InputSpec], rng: np.random.Generator,
                 bindings: Mapping[str, int] | None = None, default_dim: int = 1
                 ) -> dict[str, np.ndarray]:
    """Random feeds of the right dtype and shape; symbolic dims from `bindings` or 1."""
    bindings = bindings or {}
    feeds: dict[str, Any] = {}
    for spec in specs:
        if spec.type is not None:
            feeds[spec.name] = _random_value(spec.type, rng)
            continue
        shape = tuple(d if isinstance(d, int) else int(bindings.get(str(d), default_dim))
                      for d in (spec.dims or ()))
        dtype = spec.dtype or np.dtype(np.float32)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[spec.name] = _integers(spec.name.lower(), shape, dtype, rng)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.random(shape) < 0.5
        else:
            feeds[spec.name] = np.full(shape, "x", dtype=object) if dtype.kind in "OUS" else \
                np.zeros(shape, dtype)
    return feeds


def _integers(name: str, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator
              ) -> np.ndarray:
    """Integer inputs as text models expect them: masks of ones, segment ids of zero,
    positions counting up, anything else (token ids) small non-negative numbers."""
    if "mask" in name:
        return np.ones(shape, dtype)
    if "type" in name or "segment" in name:
        return np.zeros(shape, dtype)
    if "position" in name and shape:
        return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
    return rng.integers(0, 16, shape).astype(dtype)


def _random_value(kind: onnx.TypeProto, rng: np.random.Generator) -> object:
    """A structured input's value: a sequence of two small tensors, an optional's value."""
    which = kind.WhichOneof("value")
    if which == "optional_type":
        return _random_value(kind.optional_type.elem_type, rng)
    if which == "sequence_type":
        return [_random_value(kind.sequence_type.elem_type, rng) for _ in range(2)]
    if which == "tensor_type":
        tt = kind.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim)
        dtype = np.dtype(_np_dtype(tt.elem_type) or np.float32)
        return rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else \
            np.zeros(shape, dtype)
    return None
