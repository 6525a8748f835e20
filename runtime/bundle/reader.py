"""Opening a bundle: a zip of uncompressed members, every one checked before use.

    with read_bundle("gpt2.prism") as bundle:
        bundle.manifest["schedule"]          # one row per partition
        bundle.member("partitions/p0.onnx")  # bytes, straight from the mapped file
        bundle.weights()                     # weights.bin as a uint8 array (no copy)

The driver imports this module, so it needs only the standard library and numpy. The
file is memory-mapped; each member's CRC-32 is checked against the zip directory when
the bundle is opened, and so is what the manifest says against what the members hold
(`Bundle.check`: each schedule row's sub-model reads and writes what the row says, each
declared input fits in an array), so a corrupted, truncated or edited file is refused, in
one line, before anything is loaded from it.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np

from runtime.bundle.proto import ProtoError, graph_io
from runtime.errors import BundleError, first_line
from runtime.request_memory import RequestMemory

FORMAT = "prism-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "weights.bin"
REQUEST_MEMORY = "request_memory.json"  # absent: fixed sizes, or a bundle older than it
EXTERNAL_LOCATION = WEIGHTS  # what sub-models name as their external data file
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... name length, extra length
MAX_RANK, MAX_ELEMENTS = 32, 1 << 40  # the most a declared input may ask of an array
SUFFIX = ".prism"
_ZIP_MAGIC = b"PK\x03\x04"


def is_bundle(source: object) -> bool:
    """A path to a bundle: named `*.prism`, or a file that starts as a zip does (an ONNX
    file never does)."""
    if not isinstance(source, str | Path):
        return False
    path = Path(source)
    if path.suffix == SUFFIX:
        return True
    try:
        with open(path, "rb") as fp:
            return fp.read(4) == _ZIP_MAGIC
    except OSError:
        return False


class Bundle:
    """An open bundle: its manifest and its members, read from one mapped file."""

    def __init__(self, path: str, file, mapped: mmap.mmap, members: dict[str, tuple[int, int]]):
        self.path, self._file, self._map, self._members = path, file, mapped, members
        self._weights: np.ndarray | None = None
        self.manifest: dict = self.json(MANIFEST)
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            raise BundleError(f"{path} is not a Prism bundle: its manifest names no "
                              f"{FORMAT!r} format")
        version = self.manifest.get("format_version")
        if not isinstance(version, int) or version < 1:
            raise BundleError(f"{path}: bundle format version {version!r} is not valid")
        if version > FORMAT_VERSION:
            raise BundleError(f"{path} has bundle format {version}, newer than this Prism "
                              f"reads ({FORMAT_VERSION}); recompile it or upgrade Prism")

    def check(self) -> None:
        """BundleError (one line) unless every schedule row's sub-model reads exactly the
        tensors the row says and writes at least those, and every declared input's fixed
        dimensions fit in an array (`MAX_RANK`, `MAX_ELEMENTS`)."""
        try:
            for row in self.manifest["schedule"]:
                try:
                    reads, writes = graph_io(self.member(row["model"]))
                except ProtoError as exc:
                    raise BundleError(f"{self.path}: {row['model']} is not a model: {exc}"
                                      ) from None
                if set(reads) != set(row["reads"]) or not set(row["writes"]) <= set(writes):
                    raise BundleError(
                        f"{self.path}: {row['model']} reads {sorted(reads)} and writes "
                        f"{sorted(writes)}, but its schedule row ({row['partition']}) says "
                        f"it reads {sorted(row['reads'])} and writes {sorted(row['writes'])}")
            for spec in self.manifest["inputs"]:
                _check_dims(self.path, spec["name"], spec["dims"])
        except (KeyError, TypeError) as exc:
            raise BundleError(f"{self.path}: manifest is malformed: {first_line(exc)}"
                              ) from None

    @property
    def name(self) -> str:
        return self.manifest["network"]

    def names(self) -> list[str]:
        return list(self._members)

    def member(self, name: str) -> bytes:
        start, size = self._span(name)
        return self._map[start:start + size]

    def json(self, name: str):
        try:
            return json.loads(self.member(name))
        except ValueError as exc:
            raise BundleError(f"{self.path}: {name} is not valid JSON: {first_line(exc)}"
                              ) from None

    def request_memory(self) -> RequestMemory | None:
        """What a request needs at its sizes, as compiled (`request_memory.json`); None for a
        bundle of fixed sizes or one older than that member, and for one whose member
        cannot be read: a request is then let through unchecked, as it always was."""
        if REQUEST_MEMORY not in self._members:
            return None
        try:
            return RequestMemory.from_dict(self.json(REQUEST_MEMORY))
        except (BundleError, KeyError, TypeError, ValueError):
            return None

    def weights(self) -> np.ndarray:
        """weights.bin as a read-only uint8 array over the mapped file."""
        if self._weights is None:
            start, size = self._span(WEIGHTS)
            self._weights = np.frombuffer(self._map, np.uint8, size, start)
        return self._weights

    def constants(self) -> dict[str, np.ndarray]:
        """The graph outputs that are constants (manifest `constants`), as read-only arrays:
        every request's outputs share them, so one caller's write must not reach the next
        (copies, so they outlive the mapping)."""
        weights = self.weights()
        return {name: _read_only(weights[c["offset"]:c["offset"] + c["length"]].view(
            c["dtype"]).reshape(c["shape"]).copy())
            for name, c in self.manifest["constants"].items()}

    def _span(self, name: str) -> tuple[int, int]:
        if self._map.closed:
            raise BundleError(f"{self.path} is closed")
        if name not in self._members:
            raise BundleError(f"{self.path} is incomplete: it has no {name}")
        return self._members[name]

    def close(self) -> None:
        """Unmap and close. Arrays from `weights()` must be dropped first; if one is still
        held the mapping stays until it is collected."""
        self._weights = None
        with contextlib.suppress(BufferError):
            self._map.close()
        self._file.close()

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_dims(path: str, name: str, dims: list | None) -> None:
    fixed = [d for d in dims or () if not isinstance(d, str) and d is not None]
    if any(not isinstance(d, int) or d < 0 for d in fixed):
        raise BundleError(f"{path}: input {name!r} declares dims {dims}: a dimension must be "
                          f"a whole number or a name")
    count = 1
    for d in fixed:
        count *= d
    if len(dims or ()) > MAX_RANK or count > MAX_ELEMENTS:
        raise BundleError(f"{path}: input {name!r} declares dims {dims}, more than an array "
                          f"holds here (at most {MAX_RANK} dimensions, {MAX_ELEMENTS} "
                          f"elements)")


def _members(path: str, mapped: mmap.mmap, infos: list[zipfile.ZipInfo]
             ) -> dict[str, tuple[int, int]]:
    """name -> (offset, size) of each member's bytes, each checked against its CRC-32."""
    members = {}
    with memoryview(mapped) as view:
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                raise BundleError(f"{path}: member {info.filename} is compressed; bundles "
                                  f"store members uncompressed (re-zipped by another tool?)")
            head = info.header_offset
            sig, name_len, extra_len = _LOCAL_HEADER.unpack_from(
                view, head) if head + _LOCAL_HEADER.size <= len(view) else (b"", 0, 0)
            start = head + _LOCAL_HEADER.size + name_len + extra_len
            end = start + info.file_size
            if (sig != b"PK\x03\x04" or end > len(view) or bytes(
                    view[head + _LOCAL_HEADER.size:head + _LOCAL_HEADER.size + name_len])
                    != info.filename.encode()):
                raise BundleError(f"{path} is corrupted: the header of {info.filename} is "
                                  f"damaged")
            if zlib.crc32(view[start:end]) != info.CRC:
                raise BundleError(f"{path} is corrupted: {info.filename} fails its checksum")
            members[info.filename] = (start, info.file_size)
    return members


def read_bundle(path: str | Path) -> Bundle:
    """Open and check a bundle; BundleError (one line) if it is not one, is damaged or
    is from a newer format. Nothing stays open when it fails."""
    path = str(path)
    try:
        file = open(path, "rb")  # noqa: SIM115 -- the Bundle owns it until close()
    except OSError as exc:
        raise BundleError(f"cannot open bundle {path}: {exc.strerror or exc}") from None
    mapped = None
    try:
        try:
            with zipfile.ZipFile(file) as archive:
                infos = archive.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError,
                EOFError, struct.error) as exc:
            raise BundleError(f"{path} is not a Prism bundle, or is truncated: "
                              f"{first_line(exc)}") from None
        if MANIFEST not in {i.filename for i in infos}:
            raise BundleError(f"{path} is not a Prism bundle: it has no {MANIFEST}")
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        bundle = Bundle(path, file, mapped, _members(path, mapped, infos))
        bundle.check()
        return bundle
    except BaseException:
        if mapped is not None:
            mapped.close()
        file.close()
        raise


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array
