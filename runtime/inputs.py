"""What a network expects as feeds and gives back: checking given feeds, and drawing random
ones.

Plain data, no onnx: a network loaded from an ahead-of-time bundle describes its inputs from
the bundle's manifest (`InputSpec.from_dict`), one loaded from ONNX from its graph
(`input_specs`, which reads the ONNX types), and both are checked alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zipfile import BadZipFile

import numpy as np

from runtime.errors import InvalidInputError, PrismError
from runtime.free_dims import fixed_size, free_sizes, made_up_shape
from runtime.types import OutsizedFeeds

if TYPE_CHECKING:
    import onnx

    from runtime.graph import Dim, Graph

_SHAPES_KEPT = 64  # accepted shapes remembered per input


@dataclass(frozen=True)
class ValueType:
    """A declared ONNX type as plain data: `kind` is tensor, sequence, optional, map, ...;
    a tensor has its numpy `dtype` (None if numpy has none) and `dims` (ints and names),
    a sequence or optional its element type, a map its keys' `dtype` and its values' type
    as `elem`."""

    kind: str
    dtype: str | None = None
    dims: tuple[Dim, ...] | None = None
    elem: ValueType | None = None

    @classmethod
    def of(cls, proto: onnx.TypeProto) -> ValueType:
        which = proto.WhichOneof("value")
        kind = which.removesuffix("_type") if which else "value"
        if kind == "tensor":
            tensor = proto.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or None
                         for d in tensor.shape.dim) if tensor.HasField("shape") else None
            return cls(kind, _np_dtype(tensor.elem_type), dims)
        if kind in ("sequence", "optional"):
            return cls(kind, elem=cls.of(getattr(proto, which).elem_type))
        if kind == "map":
            return cls(kind, _np_dtype(proto.map_type.key_type),
                       elem=cls.of(proto.map_type.value_type))
        return cls(kind)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind}
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.dims is not None:
            out["dims"] = list(self.dims)
        if self.elem is not None:
            out["elem"] = self.elem.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> ValueType:
        elem = data.get("elem")
        dims = data.get("dims")
        return cls(data["kind"], data.get("dtype"), None if dims is None else tuple(dims),
                   None if elem is None else cls.from_dict(elem))

    def describe(self) -> str:
        if self.kind == "tensor":
            return self.dtype or "tensor"
        if self.kind == "sequence" and self.elem is not None:
            return f"sequence of {self.elem.describe()}"
        if self.kind == "optional" and self.elem is not None:
            return f"optional {self.elem.describe()}"
        if self.kind == "map" and self.elem is not None:
            key = "string" if self.dtype in (None, "object") else self.dtype
            return f"map of {key} to {self.elem.describe()}"
        return self.kind


@dataclass(frozen=True)
class InputSpec:
    """A graph input, or any tensor (`tensor_specs`). `type` is its declared type when it
    is not a plain tensor (a sequence, an optional, a map): such feeds are checked against
    it structurally."""

    name: str
    dtype: np.dtype | None
    dims: tuple[Dim, ...] | None
    type: ValueType | None = None
    rows: int | None = None  # an index into a table of this many rows: made-up values stay below
    # the only values the one-hot encoders reading it take (scikit-learn's default refuses
    # any other), one list for every element or one per column: made-up values come from them
    categories: tuple[tuple[int | str, ...], ...] | None = None
    # (axis, the least size the model reads it at: `least_sizes.least_sizes`): made-up sizes
    # take it
    least: tuple[tuple[int, int], ...] = ()
    # the one value the model looks for among these integers (BART's classifier reads the
    # last end-of-sentence token of each row): made-up rows end with it, once
    ends_with: int | None = None
    shapes_seen: set[tuple[int, ...]] = field(default_factory=set, compare=False, repr=False)

    def accepts(self, array: np.ndarray) -> bool:
        """Is `array` of this dtype and shape (a symbolic dimension takes any size)? Shapes
        accepted are remembered, so a shape seen before costs one set lookup. Equal
        dtypes need not be one object (onnxruntime's int64 is numpy's longlong, say)."""
        dtype = self.dtype
        if array.shape in self.shapes_seen and (array.dtype is dtype or dtype is None
                                                or array.dtype == dtype):
            return True
        if (dtype is not None and array.dtype != dtype) or not _shape_ok(self.dims,
                                                                          array.shape):
            return False
        if len(self.shapes_seen) < _SHAPES_KEPT:
            self.shapes_seen.add(array.shape)
        return True

    def describe(self) -> str:
        if self.type is not None:
            return self.type.describe()
        dims = "?" if self.dims is None else ", ".join(
            str(d) if d is not None else "?" for d in self.dims)
        return f"{self.dtype or '?'} [{dims}]"

    def to_dict(self) -> dict:
        """As a bundle's manifest lists it (`kind`, `dtype`, `dims`, and `type` when it is
        not a plain tensor)."""
        out: dict[str, Any] = {
            "name": self.name, "kind": "tensor" if self.type is None else self.type.kind,
            "dtype": self.dtype.name if self.dtype is not None else None,
            "dims": None if self.dims is None else list(self.dims)}
        if self.type is not None:
            out["type"] = self.type.to_dict()
        if self.rows is not None:
            out["rows"] = self.rows
        if self.categories is not None:
            out["categories"] = [list(c) for c in self.categories]
        if self.least:
            out["least"] = [list(pair) for pair in self.least]
        if self.ends_with is not None:
            out["ends_with"] = self.ends_with
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> InputSpec:
        """From a manifest row. A structured input without its `type` (an older bundle)
        keeps its kind only: its value goes to the backend as given."""
        kind, dims = data.get("kind", "tensor"), data.get("dims")
        structured = None if kind == "tensor" else ValueType.from_dict(
            data.get("type") or {"kind": kind})
        return cls(data["name"], np.dtype(data["dtype"]) if data.get("dtype") else None,
                   None if dims is None else tuple(dims), structured, data.get("rows"),
                   tuple(map(tuple, data["categories"])) if data.get("categories") else None,
                   tuple((int(axis), int(size)) for axis, size in data.get("least") or ()),
                   data.get("ends_with"))


@dataclass(frozen=True)
class Signature:
    """A network's face: the inputs it takes, its outputs in order, and those outputs that
    are constants (initializers), which no partition makes."""

    inputs: list[InputSpec]
    outputs: tuple[str, ...]
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)


def signature(graph: Graph) -> Signature:
    from runtime.stored import values

    return Signature(input_specs(graph), tuple(graph.outputs), {
        t: values(graph.initializers[t]) for t in graph.outputs
        if t in graph.initializers})


def _np_dtype(elem_type: int) -> str | None:
    from onnx import helper

    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return None


def input_specs(graph: Graph) -> list[InputSpec]:
    specs = tensor_specs(graph, graph.inputs)
    rows, categories, ends = value_limits(graph, specs)
    return [InputSpec(s.name, s.dtype, s.dims, s.type, rows.get(s.name), categories.get(s.name),
                      tuple(graph.least.get(s.name, {}).items()), ends.get(s.name))
            for s in specs]


# ops whose first input's values pass on unchanged (some of them, for a Gather's data)
_SAME_VALUES = frozenset({"Cast", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                          "Expand", "Transpose", "Slice", "Split", "Tile", "Gather",
                          "ArrayFeatureExtractor"})
Categories = tuple[tuple[int | str, ...], ...]
_IDS = 16  # made-up token ids are below it


def value_limits(graph: Graph, specs: list[InputSpec]
                 ) -> tuple[dict[str, int], dict[str, Categories], dict[str, int]]:
    """What values of each graph input the model takes, from the nodes reading its values
    through ops that pass them on unchanged, in subgraphs too:
    - the rows of the smallest table it indexes, a Gather's data along its axis (class
      labels into a table of ten embeddings, say);
    - when a one-hot encoder reading it refuses what it does not know (`zeros=0`,
      skl2onnx's export of scikit-learn's default), the categories every encoder reading
      it knows: one list for every element, or one per column of the last axis where
      each column is picked apart (a Gather along it or an ArrayFeatureExtractor);
    - the one value within those rows an Equal compares it with, a constant (BART's
      classifier finds its end-of-sentence tokens so, and fails on a row without one),
      unless only a Not reads what it finds (RoBERTa's padding mask is `ids != pad`)."""
    from runtime.graph import nested_nodes
    from runtime.stored import values

    readers: dict[str, list[onnx.NodeProto]] = {}
    # ONNX names are unique across nested scopes: one map holds every scope's readers
    for node in nested_nodes(graph.model.graph):
        for t in node.input:
            readers.setdefault(t, []).append(node)
    limits: tuple[dict[str, int], dict[str, Categories], dict[str, int]] = ({}, {}, {})
    for spec in specs:
        rows, known, strict, sought = [], [], False, set()
        todo: list[tuple[str, int | None]] = [(spec.name, None)]
        seen = {spec.name}
        while todo:
            tensor, column = todo.pop()
            for node in readers.get(tensor, ()):
                if node.op_type in _SAME_VALUES and node.input[0] == tensor:
                    picked = _column(graph, spec, node) if tensor == spec.name else column
                    todo += [(t, picked) for t in node.output if t not in seen]
                    seen.update(node.output)
                elif node.op_type == "Gather" and node.input[1:2] == [tensor]:
                    data = graph.tensors.get(node.input[0])
                    axis = _attribute(node, "axis", 0)
                    if data is not None and data.shape and -len(data.shape) <= axis < len(
                            data.shape):  # else malformed: for onnxruntime to name
                        rows.append(data.shape[axis])
                elif node.op_type == "OneHotEncoder" and node.domain == "ai.onnx.ml":
                    known.append((column, _attribute(node, "cats_int64s", []) or [
                        c.decode() for c in _attribute(node, "cats_strings", [])]))
                    strict |= _attribute(node, "zeros", 1) == 0
                elif node.op_type == "Equal" and tensor in node.input and (
                        other := graph.initializers.get(node.input[node.input[0] == tensor])
                        ) is not None and int(np.prod(other.dims)) == 1 and \
                        (value := values(other).reshape(-1)[0]).dtype.kind in "iu" and not all(
                        r.op_type == "Not" for r in readers.get(node.output[0], ())):
                    sought.add(int(value))  # not `!=` (a padding mask)
        if rows and min(rows) > 0:
            limits[0][spec.name] = min(rows)
        if strict and (categories := _categories(known, spec.dims)):
            limits[1][spec.name] = categories
        if len(sought) == 1 and 0 <= (token := sought.pop()) < min(rows or [_IDS]):
            limits[2][spec.name] = token
    return limits


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    from onnx import helper

    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _column(graph: Graph, spec: InputSpec, node: onnx.NodeProto) -> int | None:
    """The one column of the last axis `node` picks from input `spec`, if it does."""
    from runtime.stored import values

    rank = len(spec.dims or ())
    width = spec.dims[-1] if spec.dims else None
    index = graph.initializers.get(node.input[1]) if len(node.input) > 1 else None
    along_last = node.op_type == "ArrayFeatureExtractor" or (
        node.op_type == "Gather" and rank > 1 and _attribute(node, "axis", 0) % rank == rank - 1)
    if not along_last or index is None or not isinstance(width, int) or width < 1:
        return None
    picked = values(index).ravel()
    return int(picked[0]) % width if picked.size == 1 else None


def _categories(known: list[tuple[int | None, list]], dims: tuple[Dim, ...] | None
                ) -> Categories | None:
    """Values every encoder takes: one list, or (every column read apart) one per column."""
    def common(lists: list[list]) -> tuple[int | str, ...]:
        return tuple(sorted(set(lists[0]).intersection(*lists[1:])))

    whole = [cats for column, cats in known if column is None]
    columns = {column for column, _ in known if column is not None}
    if not columns:
        return (both,) if (both := common(whole)) else None
    width = dims[-1] if dims else None
    if columns != set(range(width if isinstance(width, int) else -1)):
        return None
    out = tuple(common([*whole, *(cats for c, cats in known if c == j)]) for j in sorted(columns))
    return out if all(out) else None


def tensor_specs(graph: Graph, names: Iterable[str]) -> list[InputSpec]:
    """Specs of any tensors by name, as declared (a partition's outputs, say)."""
    specs = []
    for name in names:
        info = graph.tensors.get(name)
        dtype = np.dtype(info.dtype) if info and info.dtype else None
        kind = graph.types.get(name)
        structured = kind is not None and kind.WhichOneof("value") != "tensor_type"
        specs.append(InputSpec(name, dtype, info.dims if info else None,
                               ValueType.of(kind) if structured and kind is not None else None))
    return specs


def _structured(network: str, spec: InputSpec, kind: ValueType, value: object,
                where: str) -> object:
    """A sequence feed as a list of arrays, an optional as None or its value; each element
    checked against the declared element type where one is known."""
    if kind.kind == "optional":
        if value is None or kind.elem is None:
            return value
        return _structured(network, spec, kind.elem, value, where)
    if kind.kind == "sequence":
        if not isinstance(value, list | tuple):
            raise InvalidInputError(f"input {spec.name!r} of {network}{where}: expected "
                                    f"{kind.describe()}, got {type(value).__name__}")
        if kind.elem is None:
            return list(value)
        return [_structured(network, spec, kind.elem, v, f"{where}[{i}]")
                for i, v in enumerate(value)]
    if kind.kind == "tensor":
        array = value if type(value) is np.ndarray else np.asarray(value)
        want = kind.dtype
        if want is not None and array.dtype != np.dtype(want):
            raise InvalidInputError(f"input {spec.name!r} of {network}{where}: expected "
                                    f"{want}, got {array.dtype}")
        return array
    if kind.kind == "map" and not isinstance(value, Mapping):
        raise InvalidInputError(f"input {spec.name!r} of {network}{where}: expected "
                                f"{kind.describe()} (a dict), got {type(value).__name__}")
    return value  # maps and other kinds go to the backend as given


def read_npz(path: str | Path, what: str, error: type[PrismError] = InvalidInputError
             ) -> dict[str, np.ndarray]:
    """The named arrays of an .npz file; `error`, one line naming the file (as `what`:
    "calibration data"), when it is missing or not an .npz of arrays."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except (OSError, ValueError, BadZipFile) as exc:
        raise error(f"{path} is not an .npz of arrays: {npz_problem(exc)}") from None


def npz_problem(exc: Exception) -> str:
    """What numpy said of an .npz it could not read, with what to do about object arrays
    (text saved as `dtype=object`), which it reads only as pickles: never trusted here."""
    text = " ".join(str(exc).split())
    if "allow_pickle" in text:
        return (f"{text}: it holds object arrays, read only as pickles, which are not "
                f"trusted; save text as numpy strings (np.array(['a', 'b']), no dtype=object)")
    return text


def array_text(array: np.ndarray) -> str:
    """An array's dtype and shape, as a spec is described: "float64 [2, 256]"."""
    return f"{array.dtype} [{', '.join(map(str, array.shape))}]"


def shapes_text(shapes: Mapping[str, Sequence[int]], most: int | None = 4) -> str:
    """Inputs and their shapes as messages name them, "ids [1, 8], mask [1, 8]", past
    `most` of them a ", ..."."""
    named = list(shapes.items())
    shown = ", ".join(f"{name} {list(shape)}" for name, shape in named[:most])
    return shown + ", ..." * (most is not None and len(named) > most)


def _shape_ok(dims: tuple[Dim, ...] | None, shape: tuple[int, ...]) -> bool:
    if dims is None:
        return True
    return len(dims) == len(shape) and all(
        not isinstance(d, int) or d == s for d, s in zip(dims, shape, strict=True))


# A symbolic dimension named on several inputs, and where: (input index, axis) each
SharedDim = tuple[str, tuple[tuple[int, int], ...]]


def shared_dims(specs: list[InputSpec]) -> tuple[SharedDim, ...]:
    """The symbolic dimensions that more than one place among the inputs names. ONNX reads
    one name as one size (TensorRT checks it the same way), and a graph relies on it: a
    batch of images and a batch of features of different sizes reach a Concat that fails,
    or a batcher that would shift other requests' rows."""
    places: dict[str, list[tuple[int, int]]] = {}
    for i, spec in enumerate(specs):
        if spec.type is None and spec.dims:
            for axis, dim in enumerate(spec.dims):
                if isinstance(dim, str):
                    places.setdefault(dim, []).append((i, axis))
    return tuple((name, tuple(where)) for name, where in places.items() if len(where) > 1)


def sizes_given(specs: list[InputSpec], feeds: Mapping[str, Any]) -> dict[str, int]:
    """The sizes checked feeds (`check_feeds`) give their inputs' symbolic dimensions: a
    network costed at them is planned for what it will be sent."""
    sizes: dict[str, int] = {}
    for spec in specs:
        value = feeds.get(spec.name)
        if spec.type is None and spec.dims and isinstance(value, np.ndarray):
            for dim, size in zip(spec.dims, value.shape, strict=False):
                if isinstance(dim, str) and fixed_size(dim) is None:
                    sizes.setdefault(dim, int(size))
    return sizes


def bound_to_feeds(graph: Graph, feeds: Mapping[str, Any],
                   bindings: Mapping[str, int] | None) -> tuple[Graph, dict[str, np.ndarray]]:
    """The graph bound at the sizes one request's `feeds` give its symbolic dimensions
    (where `bindings` names none), so it is costed at them, and the feeds checked
    (`sample_feeds`: one line naming what is wrong)."""
    from runtime.graph import load_graph

    specs = input_specs(graph)
    try:
        checked = check_feeds(graph.name, specs, feeds)
    except InvalidInputError as exc:
        raise InvalidInputError(f"sample_feeds: {exc}") from None
    sizes = {**sizes_given(specs, checked), **(bindings or {})}
    return load_graph(graph, bindings=sizes or None, name=graph.name), checked


def _check_shared(network: str, specs: list[InputSpec], shared: tuple[SharedDim, ...],
                  arrays: list[Any]) -> None:
    """InvalidInputError naming the two inputs whose sizes of one named dimension differ."""
    for name, where in shared:
        (i, axis), *rest = where
        size = arrays[i].shape[axis]
        for j, other_axis in rest:
            if arrays[j].shape[other_axis] != size:
                raise InvalidInputError(
                    f"inputs {specs[i].name!r} and {specs[j].name!r} of {network} disagree on "
                    f"dimension {name!r}: {size} and {arrays[j].shape[other_axis]}")


def check_feeds(network: str, specs: list[InputSpec], feeds: Mapping[str, object]
                ) -> dict[str, np.ndarray]:
    """Feeds as arrays, in input order, or InvalidInputError naming the input, expected vs
    given, or the two inputs that give one named dimension two sizes. (`FeedCheck` puts a
    short pass in front, for a network's every request.)"""
    if type(feeds) is not dict and not isinstance(feeds, Mapping):
        raise InvalidInputError(f"feeds for {network} must be a dict of input name -> array, "
                                f"got {type(feeds).__name__}")
    out: dict[str, Any] = {}  # arrays; lists and None for sequence and optional inputs
    for spec in specs:
        value = feeds.get(spec.name)
        if spec.type is not None and (value is not None or spec.name in feeds
                                      or spec.type.kind == "optional"):
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
        array = as_text(network, spec, array)
        if not spec.accepts(array):
            raise InvalidInputError(f"input {spec.name!r} of {network}: expected "
                                    f"{spec.describe()}, got {array_text(array)}")
        out[spec.name] = array
    if len(feeds) != len(out) and any(k not in out for k in feeds):
        extra = sorted(k for k in feeds if k not in out)
        raise InvalidInputError(f"{network} has no input {extra[0]!r}; inputs are "
                                f"{', '.join(map(repr, sorted(out)))}")
    if shared := shared_dims(specs):
        _check_shared(network, specs, shared, [out[s.name] for s in specs])
    return out


def as_text(network: str, spec: InputSpec, array: np.ndarray) -> np.ndarray:
    """For a string input, numpy's fixed-width strings (what np.savez keeps text as) as the
    str objects onnxruntime reads an ONNX string tensor from, bytes decoded as UTF-8; any
    other array as it is."""
    if array.dtype.kind not in "US" or spec.dtype is None or spec.dtype.kind != "O":
        return array
    try:
        return (np.char.decode(array, "utf-8") if array.dtype.kind == "S" else array
                ).astype(object)
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"input {spec.name!r} of {network}: bytes that are not UTF-8 "
                                f"text ({exc.reason} at byte {exc.start})") from None


class FeedCheck:
    """`check_feeds` for one network's every request, with a short pass in front: most
    feeds are arrays of a dtype and shape accepted before, and checking those touches
    only a tuple per input (under load, every object touched is a cache miss)."""

    __slots__ = ("admit", "agreed", "expected", "network", "shared", "specs", "width")

    def __init__(self, network: str, specs: list[InputSpec],
                 admit: Callable[[dict[str, tuple[int, ...]]], bool] | None = None):
        """`admit(shapes)`: raises where feeds of shapes not seen before may not run (a
        request needing more memory than the machine has: `request_memory`); True where
        they are outsized (their feeds are checked as `OutsizedFeeds`)."""
        self.network, self.specs, self.width, self.admit = network, specs, len(specs), admit
        self.expected = tuple((s.name, s.dtype, s.shapes_seen) for s in specs)
        # with a dimension named twice, each input's shape seen before is not enough:
        # the shapes must have been seen together (`agreed`, every input's shape in order)
        self.shared = bool(shared_dims(specs))
        self.agreed: set[tuple[tuple[int, ...], ...]] = set()

    def check(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        if type(feeds) is dict and len(feeds) == self.width:
            out = {}
            for name, dtype, seen in self.expected:
                value = feeds.get(name)
                if type(value) is not np.ndarray or value.dtype is not dtype or \
                        value.shape not in seen:
                    break
                out[name] = value
            else:
                if not self.shared or tuple(v.shape for v in out.values()) in self.agreed:
                    return out
        out = check_feeds(self.network, self.specs, feeds)
        if self.admit is not None:
            shapes = {k: v.shape for k, v in out.items() if type(v) is np.ndarray}
            try:
                outsized = self.admit(shapes)
            except PrismError:  # asked again, it is refused again: not a shape seen
                self._forget(shapes)
                raise
            if outsized:  # asked again, judged again: the usual requests may grow to it
                self._forget(shapes)
                return OutsizedFeeds(out)
        if self.shared and len(self.agreed) < _SHAPES_KEPT and all(
                type(v) is np.ndarray for v in out.values()):
            self.agreed.add(tuple(v.shape for v in out.values()))
        return out

    def _forget(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Feeds of these shapes take the full check, and `admit`, again."""
        for spec in self.specs:
            spec.shapes_seen.discard(shapes.get(spec.name, ()))


def graph_outputs(values: Mapping[str, Any], names: Iterable[str], inputs: Iterable[str] = ()
                  ) -> dict[str, Any]:
    """A request's graph outputs (`names`) from its tensors. One that is also a graph input
    (among `inputs`) is given back as a copy, as onnxruntime gives it: what the caller then
    writes into either stays apart from the other."""
    out = {t: values[t] for t in names}
    for t in inputs:
        if t in out and type(out[t]) is np.ndarray:
            out[t] = out[t].copy()
    return out


def random_feeds(specs: list[InputSpec], rng: np.random.Generator,
                 bindings: Mapping[str, int] | None = None, default_dim: int = 1
                 ) -> dict[str, np.ndarray]:
    """Random feeds of the right dtype and shape; symbolic dims from `bindings`, else as
    `free_dims` makes them up (`default_dim`, an image's sides IMAGE_SIDE)."""
    sizes = free_sizes(((s.name, s.dims, s.dtype is None or s.dtype.kind == "f", dict(s.least))
                        for s in specs if s.type is None), bindings or {}, default_dim)
    feeds: dict[str, Any] = {}
    for spec in specs:
        if spec.type is not None:
            feeds[spec.name] = _random_value(spec.type, rng)
            continue
        dtype = spec.dtype or np.dtype(np.float32)
        shape = made_up_shape(spec.dims or (), dtype.kind == "f", sizes, default_dim)
        if spec.categories:
            feeds[spec.name] = _categorical(spec.categories, shape, dtype, rng)
        elif dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[spec.name] = _integers(spec.name.lower(), shape, dtype, rng, spec.rows,
                                         spec.ends_with)
        elif dtype.kind == "b":  # an array even at shape (): numpy gives a scalar there
            feeds[spec.name] = np.asarray(rng.random(shape) < 0.5)
        else:
            feeds[spec.name] = np.full(shape, "x", dtype=object) if dtype.kind in "OUS" else \
                np.zeros(shape, dtype)
    return feeds


def _categorical(categories: Categories, shape: tuple[int, ...], dtype: np.dtype,
                 rng: np.random.Generator) -> np.ndarray:
    """Values drawn from one list of categories, or column by column from one per column."""
    kind = object if dtype.kind in "OUS" else dtype
    if len(categories) == 1:
        return np.asarray(rng.choice(np.array(categories[0], kind), shape), kind)
    return np.stack([rng.choice(np.array(c, kind), shape[:-1]) for c in categories], axis=-1)


def _integers(name: str, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator,
              rows: int | None = None, ends_with: int | None = None) -> np.ndarray:
    """Integer inputs as text models expect them: masks of ones, segment ids of zero,
    positions counting up, anything else (token ids) small non-negative numbers, below
    the `rows` of the table they index; a row ending with `ends_with`, once, as a
    tokenizer ends a sentence."""
    if "mask" in name:
        return np.ones(shape, dtype)
    if "type" in name or "segment" in name:
        return np.zeros(shape, dtype)
    if "position" in name and shape:
        return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
    high = min(_IDS, rows or _IDS)
    if ends_with is None or not shape or not shape[-1] or high < 2:  # rows of no tokens too
        return rng.integers(0, high, shape).astype(dtype)
    ids = rng.integers(0, high - 1, shape)
    ids[ids >= ends_with] += 1  # every value but `ends_with`
    ids[..., -1] = ends_with
    return ids.astype(dtype)


def _random_value(kind: ValueType, rng: np.random.Generator) -> object:
    """A structured input's value: a sequence of two small tensors, an optional's value, a
    map of three keys (text keys "a", "b", "c": a DictVectorizer ignores those it lacks)."""
    if kind.kind == "optional":
        return None if kind.elem is None else _random_value(kind.elem, rng)
    if kind.kind == "sequence":
        return [] if kind.elem is None else [_random_value(kind.elem, rng) for _ in range(2)]
    if kind.kind == "tensor":
        shape = tuple(d if isinstance(d, int) else 1 for d in (kind.dims or ()))
        dtype = np.dtype(kind.dtype or np.float32)
        return rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else \
            np.zeros(shape, dtype)
    if kind.kind == "map" and kind.elem is not None:
        keys = [0, 1, 2] if kind.dtype not in (None, "object") else ["a", "b", "c"]
        return {k: _random_value(kind.elem, rng) for k in keys}
    return None
