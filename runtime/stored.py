"""Weights left in the file they were read from. A network loaded from a file keeps each
weight of `STORED_MIN` bytes or more as a shell: its name, type and dims, its data named
as external data at its place in that file (`Stored`), nothing of it in memory, nor ever
read as the model loads: one inside the .onnx file is skipped as the file is parsed
(`parsed`), one in an external data file is not read (`external_shells`). onnxruntime's
sessions hold the only copy, read through a mapping of the file (`devices/external.Held`),
where the network would otherwise hold a second. What reads the values (folding, a
bundle, the quantizer, training) fills a copy (`with_weights`) or reads one (`values`).
The graph keeps each such file open (`kept_open`): removed, or another renamed over it,
it reads as it was; written in place, it is refused (`opened`).

A weight inside the .onnx file itself is found by reading protobuf's wire format, and the
file is parsed with those bytes left out (`_without`): onnx's parser hands out copies,
never where bytes lie. A shell is Prism's own: one a file or bytes bring is not trusted
(`disowned`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import weakref
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from runtime.errors import ModelLoadError
from runtime.large import LARGE_INIT, shell, tensor_bytes, typed_only

STORED_MIN = LARGE_INIT  # a weight this large read from a file stays there: the checker and
# shape inference are handed such a weight as its type alone (`runtime.large`)
VERSION_KEY = "prism.version"  # a shell's external data entry: its file's size:mtime
# (path, version) -> the file as read, open while a graph holds it (`kept_open`)
_OPEN: weakref.WeakValueDictionary[tuple[str, tuple[int, int]], BinaryIO] = \
    weakref.WeakValueDictionary()


@dataclass(frozen=True)
class Stored:
    """Where a weight lies in a file: the file's path, and the bytes
    [offset, offset + length); `version`, the file's size and modification time when it
    was read (a file written since is not the one read)."""

    path: str
    offset: int
    length: int
    version: tuple[int, int]


def file_version(path: str | os.PathLike) -> tuple[int, int]:
    """A file's size and modification time: what changes when it is written."""
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def external_shells(model: onnx.ModelProto, folder: str) -> None:
    """In place: each initializer of `STORED_MIN` bytes or more that an external data file
    holds (`folder`: the model's) made a shell naming its place, none of it read, once onnx
    has checked where the file is and that the bytes lie within it; every other tensor's
    external data read in. onnx's errors (ValueError, OSError) as onnx raises them."""
    for init in model.graph.initializer:
        if external_data_helper.uses_external_data(init) and stored_at(init) is None:
            at = _external_place(init, folder)
            if at is not None:
                init.CopyFrom(_pointing(init, at))
    for tensor in external_data_helper._get_all_tensors(model):
        if external_data_helper.uses_external_data(tensor) and stored_at(tensor) is None:
            external_data_helper.load_external_data_for_tensor(tensor, folder)


def _external_place(init: onnx.TensorProto, folder: str) -> Stored | None:
    """Where an external initializer's bytes lie, found as onnx finds them (its checks of
    the file's location); None where its entry is not exactly its bytes, or it is small."""
    info = external_data_helper.ExternalDataInfo(init)
    fd = external_data_helper._open_external_data_fd(folder, info.location, init.name, True)
    with os.fdopen(fd, "rb") as file:
        version, offset, length = _version_of(file), info.offset or 0, info.length
    if length is None or length != tensor_bytes(init) or length < STORED_MIN \
            or offset + length > version[0]:
        return None
    return Stored(os.path.abspath(os.path.join(folder, info.location)), offset, length, version)


def _pointing(init: onnx.TensorProto, at: Stored) -> onnx.TensorProto:
    out = typed_only(init)
    out.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", at.path), ("offset", at.offset), ("length", at.length),
                       (VERSION_KEY, "{}:{}".format(*at.version))):
        out.external_data.add(key=key, value=str(value))
    return out


def stored_at(tensor: onnx.TensorProto) -> Stored | None:
    """Where a shell's data lies; None for a tensor that holds its own."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    where = {e.key: e.value for e in tensor.external_data}
    if VERSION_KEY not in where:
        return None
    size, mtime = where[VERSION_KEY].split(":")
    return Stored(where["location"], int(where["offset"]), int(where["length"]),
                  (int(size), int(mtime)))


def kept_open(model: onnx.ModelProto) -> tuple[BinaryIO, ...]:
    """Each file the model's shells name, open: held by the graph, a file stays readable
    as it was read when it is removed or another is renamed over it (a model exported to
    a temporary folder, a repository updated). One written in place is refused (`opened`).
    A file already written since is left out."""
    files = []
    for key in {(at.path, at.version) for at in held_in(model).values()}:
        file = _OPEN.get(key)
        if file is None:
            try:
                file = open(key[0], "rb")  # noqa: SIM115 - the graph holds it open
            except OSError:
                continue
            if _version_of(file) != key[1]:
                file.close()
                continue
            _OPEN[key] = file
        files.append(file)
    return tuple(files)


@contextlib.contextmanager
def opened(at: Stored, tensor: str) -> Iterator[BinaryIO]:
    """The file `at` lies in as it was read: the one a graph keeps open, else opened by its
    path; a one-line ModelLoadError if it was written since (or is gone)."""
    file = _OPEN.get((at.path, at.version))
    with contextlib.ExitStack() as stack:
        if file is None:
            with contextlib.suppress(OSError):
                file = stack.enter_context(open(at.path, "rb"))
        if file is None or _version_of(file) != at.version:
            raise ModelLoadError(f"{at.path} was written or removed since weight {tensor!r} "
                                 f"was read from it; load the model again")
        yield file


def _version_of(file: BinaryIO) -> tuple[int, int]:
    stat = os.fstat(file.fileno())
    return stat.st_size, stat.st_mtime_ns


def filled(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """The tensor with its data: a shell's read from its file, a copy; any other as it is."""
    at = stored_at(tensor)
    if at is None:
        return tensor
    with opened(at, tensor.name) as file:
        data = os.pread(file.fileno(), at.length, at.offset)
    out = typed_only(tensor)
    out.raw_data = data
    return out


def values(tensor: onnx.TensorProto) -> np.ndarray:
    """An initializer's values, a shell's read from its file."""
    return numpy_helper.to_array(filled(tensor))


class Mapped:
    """Files shells name, each mapped once as it was read (`opened`): a shell's bytes as a
    view of its file (`bytes_of`), its values so (`values`), and whether an array made
    from those values is still bytes of a file (`shell`). A Split, Squeeze or Reshape of a
    weight is (a mixture of experts' stacked weights split one per expert): a shell then
    names those bytes, where a copy would hold them."""

    def __init__(self) -> None:
        self._maps: dict[tuple[str, tuple[int, int]], np.memmap] = {}

    def bytes_of(self, at: Stored, tensor: str) -> np.ndarray:
        key = (at.path, at.version)
        if key not in self._maps:
            with opened(at, tensor) as file:
                self._maps[key] = np.memmap(file, np.uint8, mode="r")
        return self._maps[key][at.offset:at.offset + at.length]

    def values(self, tensor: onnx.TensorProto) -> np.ndarray:
        """A shell's values, a read-only view of its file; any other tensor's, read."""
        at = stored_at(tensor)
        if at is None or sys.byteorder != "little":  # ONNX's raw bytes are little-endian
            return values(tensor)
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        return self.bytes_of(at, tensor.name).view(dtype).reshape(tuple(tensor.dims))

    def shell(self, array: np.ndarray, name: str) -> onnx.TensorProto | None:
        """A shell named `name` for `array` if it is `STORED_MIN` bytes or more of a mapped
        file, in order (its raw bytes, then); else None."""
        if array.nbytes < STORED_MIN or not array.flags.c_contiguous:
            return None
        start = array.__array_interface__["data"][0]
        for (path, version), whole in self._maps.items():
            offset = start - whole.__array_interface__["data"][0]
            if offset >= 0 and offset + array.nbytes <= whole.size:
                typed = onnx.TensorProto(name=name, dims=array.shape,
                                         data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
                return _pointing(typed, Stored(path, offset, array.nbytes, version))
        return None


def with_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` holding every weight's data: what onnx's tools and onnxruntime
    given a model's bytes read."""
    if not any(stored_at(t) for t in model.graph.initializer):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    return shell(model, filled, 0)


def held_in(model: onnx.ModelProto) -> dict[str, Stored]:
    """name -> where each shell among the model's initializers lies."""
    return {t.name: at for t in model.graph.initializer if (at := stored_at(t)) is not None}


def parsed(path: str | os.PathLike) -> onnx.ModelProto:
    """The ONNX (protobuf) file at `path`, its external data not read, parsed from a
    mapping of it with each initializer's raw bytes of `STORED_MIN` or more left out: a
    shell naming their place (its length its dims' and type's, and no other data), or,
    where it is not one, the bytes put back for the checker to judge. Protobuf merges a
    message given twice: a file whose graph it gives twice is parsed whole, an initializer
    it names twice keeps its bytes."""
    model = onnx.ModelProto()
    with open(path, "rb") as file:
        version = _version_of(file)
        if not version[0]:  # an empty file is an empty model, as in onnx
            return model
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                graph, raws = _raw_weights(data)
            except (IndexError, ValueError, UnicodeDecodeError):
                graph, raws = None, {}
            if graph is None or not raws:
                model.ParseFromString(memoryview(data))
                return disowned(model)
            model.ParseFromString(_without(data, graph, raws))
            disowned(model)
            for init in model.graph.initializer:
                if init.name in raws:
                    _, start, end = raws[init.name][1]
                    at = Stored(os.path.abspath(path), start, end - start, version)
                    if _bare(init) and at.length == tensor_bytes(init):
                        init.CopyFrom(_pointing(init, at))
                    else:
                        init.raw_data = data[start:end]
    return model


def disowned(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (read from a file or bytes) with any external data entry naming a shell's
    version dropped, in place: its external data is then the file's to give, found and
    checked as onnx finds it. A shell is Prism's own; one a file brought could name any
    file on the machine as a weight."""
    for tensor in external_data_helper._get_all_tensors(model):
        entries = tensor.external_data
        for i in reversed(range(len(entries))):
            if entries[i].key == VERSION_KEY:
                del entries[i]
    return model


def _bare(init: onnx.TensorProto) -> bool:
    """Does the tensor hold nothing but its name, type and dims (its raw bytes left out)?
    Its data may be said to lie in the file itself, as onnx says of external data it read
    in (a model saved again in one file)."""
    return {f.name for f, _ in init.ListFields()} <= {
        "name", "data_type", "dims", "doc_string", "data_location"} \
        and init.data_location == onnx.TensorProto.DEFAULT


Span = tuple[int, int, int]  # a field's tag, and its payload's start and end


def _raw_weights(data: mmap.mmap) -> tuple[Span | None, dict[str, tuple[Span, Span]]]:
    """The file's graph field, and name -> (its initializer's field, its raw bytes' field)
    for each initializer of `STORED_MIN` raw bytes or more, named once; (None, {}) where
    the graph is not given once."""
    graphs = [(a, s, e) for f, a, s, e in _fields(data, 0, len(data)) if f == GRAPH]
    if len(graphs) != 1:
        return None, {}
    seen: list[tuple[str, Span, Span | None]] = []
    for field, at, start, end in _fields(data, *graphs[0][1:]):
        if field == INITIALIZER:
            parts = {f: (a, s, e) for f, a, s, e in _fields(data, start, end)}
            name = data[slice(*parts[NAME][1:])].decode() if NAME in parts else ""
            seen.append((name, (at, start, end), parts.get(RAW)))
    once = Counter(name for name, _, _ in seen)
    return graphs[0], {name: (tensor, raw) for name, tensor, raw in seen
                       if raw is not None and once[name] == 1 and raw[2] - raw[1] >= STORED_MIN}


def _without(data: mmap.mmap, graph: Span, raws: Mapping[str, tuple[Span, Span]]) -> bytes:
    """The file's bytes with each of `raws`' raw bytes field left out, the initializer and
    graph around it encoded again to fit (everything else copied as it is)."""
    parts, at = [], graph[1]
    for tensor, raw in sorted(raws.values()):
        parts += [data[at:tensor[0]],
                  _delimited(INITIALIZER, data[tensor[1]:raw[0]] + data[raw[2]:tensor[2]])]
        at = tensor[2]
    body = b"".join([*parts, data[at:graph[2]]])
    return b"".join([data[:graph[0]], _delimited(GRAPH, body), data[graph[2]:]])


def _delimited(field: int, payload: bytes) -> bytes:
    return _varint_bytes(field << 3 | 2) + _varint_bytes(len(payload)) + payload


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


GRAPH, INITIALIZER, NAME, RAW = 7, 5, 8, 9  # ModelProto.graph, .initializer, TensorProto's
_FIXED = {1: 8, 5: 4}  # wire type -> bytes of a fixed-size field


def _fields(data: mmap.mmap, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, its tag's start, its payload's start and end) of each length-delimited
    field of the message at [start, end); other fields skipped; ValueError on what is not
    protobuf."""
    at = start
    while at < end:
        tag_at = at
        tag, at = _varint(data, at)
        wire = tag & 7
        if wire == 0:
            _, at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > end:
                raise ValueError("field past its message")
            yield tag >> 3, tag_at, at, at + size
            at += size
        elif wire in _FIXED:
            at += _FIXED[wire]
        else:
            raise ValueError(f"wire type {wire}")
    if at != end:
        raise ValueError("message overruns")


def _varint(data: mmap.mmap, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
