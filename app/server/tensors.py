"""Open Inference Protocol tensors <-> numpy: datatypes, JSON data, and Triton's binary
tensor data extension (an inference header, then each binary tensor's raw bytes in order).

Everything a client sends is checked before it is trusted: a shape's element count against
the data given (binary: against the bytes sent, a BYTES element taking at least its 4-byte
length, before anything is allocated for it), a `binary_data_size` against the bytes there
are, the header length against the body. A failed check is a `TensorError` (HTTP 400)
naming the tensor and what is wrong. Only memory the body already holds is ever asked
for: binary inputs are views of the body.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from runtime.errors import first_line
from runtime.inputs import InputSpec

DTYPES: dict[str, np.dtype] = {name: np.dtype(t) for name, t in (
    ("BOOL", np.bool_), ("UINT8", np.uint8), ("UINT16", np.uint16), ("UINT32", np.uint32),
    ("UINT64", np.uint64), ("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32),
    ("INT64", np.int64), ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64),
    ("BYTES", np.object_))}
_DATATYPES = {dtype: name for name, dtype in DTYPES.items()}
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
DEFAULT_PRIORITY = 1  # Triton's "0: the default level", placed at its highest level (1)
_LENGTH = struct.Struct("<I").unpack_from  # a BYTES element's length
# a model configuration's parameter: its inputs as Prism reads them (`InputSpec.to_dict`)
INPUT_SPECS = "input_specs"
# JSON text past this is read by Python's json, which peaks near 3x the text where
# orjson (yyjson) reserves 14x: 5x slower, but a 64 MB body no longer takes a gigabyte
LARGE_JSON = 8 << 20


def config_type(datatype: str) -> str:
    """A model configuration's `data_type` for a protocol datatype (BYTES: TYPE_STRING)."""
    return f"TYPE_{'STRING' if datatype == 'BYTES' else datatype}"


def from_config_type(data_type: object) -> str | None:
    """The protocol datatype a configuration's `data_type` names, or None."""
    kind = str(data_type).removeprefix("TYPE_")
    kind = "BYTES" if kind == "STRING" else kind
    return kind if kind in DTYPES else None


class TensorError(ValueError):
    """The request is malformed; the message is one line for the client."""


def datatype(dtype: np.dtype | None) -> str:
    """The protocol's name for a numpy dtype (strings of any width are BYTES)."""
    if dtype is None:
        return "BYTES"
    name = _DATATYPES.get(dtype)
    if name is None:
        name = "BYTES" if dtype.kind in "OUS" else dtype.name.upper()
    return name


@dataclass(frozen=True)
class InferRequest:
    feeds: dict[str, np.ndarray]
    outputs: dict[str, bool] | None  # requested output -> as binary; None: all, as default
    binary_default: bool
    priority: int
    timeout: float | None  # seconds
    id: str | None = None
    classes: dict[str, int] = field(default_factory=dict)  # output -> classes asked for


def parse_infer(body: bytes, header_length: str | None, inputs: Sequence[InputSpec]
                ) -> InferRequest:
    """An inference request body: JSON, JSON then binary tensors (`header_length` is the
    Inference-Header-Content-Length header), or one raw binary tensor (header length 0)."""
    if header_length is None:
        return _request(json_object(body), memoryview(b""))
    try:
        size = int(header_length)
    except ValueError:
        size = -1
    if not 0 <= size <= len(body):
        raise TensorError(f"Inference-Header-Content-Length {header_length!r} is not a "
                          f"length within the {len(body)}-byte body")
    if size == 0:
        return _raw(body, inputs)
    return _request(json_object(body[:size]), memoryview(body)[size:])


def json_object(text: bytes | memoryview, what: str = "request") -> dict:
    try:
        value = orjson.loads(text) if len(text) <= LARGE_JSON else json.loads(bytes(text))
    except orjson.JSONDecodeError as exc:
        value = _non_finite(bytes(text), exc, what)
    except (ValueError, RecursionError) as exc:  # Python's json (NaN and Infinity it reads)
        raise TensorError(f"{what} body is not valid JSON: {first_line(exc)}") from None
    if not isinstance(value, dict):
        raise TensorError(f"{what} body must be a JSON object, got {type(value).__name__}")
    return value


def _non_finite(text: bytes, error: orjson.JSONDecodeError, what: str) -> Any:
    """JSON with NaN, Infinity or -Infinity for numbers, as Triton and tritonclient (Python's
    json) write them; orjson refuses those words, Python's json reads them."""
    if b"NaN" in text or b"Infinity" in text:
        try:
            return json.loads(text)
        except ValueError:
            pass
    raise TensorError(f"{what} body is not valid JSON: {error}") from None


def _request(header: dict, binary: memoryview) -> InferRequest:
    given = header.get("inputs")
    if not isinstance(given, list) or not given:
        raise TensorError("request needs 'inputs', a non-empty list of tensors")
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for i, tensor in enumerate(given):
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise TensorError(f"inputs[{i}] must be an object with a 'name'")
        name = tensor["name"]
        if name in feeds:
            raise TensorError(f"input {name!r} is given twice")
        feeds[name], offset = _input(tensor, binary, offset)
    if offset != len(binary):
        raise TensorError(f"{len(binary) - offset} bytes of binary data follow the last "
                          f"binary input")
    params = _parameters(header.get("parameters"), "request")
    for key in params:
        if key.startswith("triton_"):
            raise TensorError(f"parameter {key!r}: keys starting with 'triton_' are reserved")
    binary_default = _flag(params, "binary_data_output", "request")
    outputs, classes = None, {}
    if header.get("outputs") is not None:
        if not isinstance(header["outputs"], list):
            raise TensorError("'outputs' must be a list")
        outputs = {}
        for i, out in enumerate(header["outputs"]):
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise TensorError(f"outputs[{i}] must be an object with a 'name'")
            out_params = _parameters(out.get("parameters"), f"output {out['name']!r}")
            if "classification" in out_params:
                classes[out["name"]] = _count(out_params["classification"], out["name"])
            flag = out_params.get("binary_data", binary_default)
            if not isinstance(flag, bool):
                raise TensorError(f"output {out['name']!r}: 'binary_data' must be a boolean")
            outputs[out["name"]] = flag
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise TensorError("'id' must be a string")
    timeout_us = _whole(params, "timeout")
    return InferRequest(feeds, outputs, binary_default,
                        _whole(params, "priority") or DEFAULT_PRIORITY,
                        timeout_us / 1e6 if timeout_us else None, request_id, classes)


def _count(value: Any, output: str) -> int:
    if type(value) is not int or value < 1:
        raise TensorError(f"output {output!r}: 'classification' must be a whole number >= 1, "
                          f"got {value!r}")
    return value


def _parameters(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TensorError(f"{where} 'parameters' must be an object")
    return value


def _flag(params: Mapping, key: str, where: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise TensorError(f"{where} parameter {key!r} must be a boolean")
    return value


def _whole(params: Mapping, key: str) -> int:
    value = params.get(key, 0)
    if type(value) is not int or value < 0:
        raise TensorError(f"parameter {key!r} must be a whole number >= 0, got {value!r}")
    return value


def _shape(tensor: dict) -> tuple[int, ...]:
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise TensorError(f"input {tensor['name']!r}: 'shape' must be a list of whole "
                          f"numbers >= 0, got {shape!r}")
    return tuple(shape)


def _dtype(tensor: dict) -> np.dtype:
    name = tensor.get("datatype")
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise TensorError(f"input {tensor['name']!r}: unknown datatype {name!r}; use one of "
                          f"{', '.join(DTYPES)}")
    return dtype


def _input(tensor: dict, binary: memoryview, offset: int) -> tuple[np.ndarray, int]:
    name, shape, dtype = tensor["name"], _shape(tensor), _dtype(tensor)
    count = math.prod(shape)
    params = _parameters(tensor.get("parameters"), f"input {name!r}")
    if "binary_data_size" not in params:
        if "data" not in tensor:
            raise TensorError(f"input {name!r} has neither 'data' nor binary_data_size")
        return _from_json(name, tensor["data"], shape, count, dtype), offset
    size = params["binary_data_size"]
    if type(size) is not int or not 0 <= size <= len(binary) - offset:
        raise TensorError(f"input {name!r}: binary_data_size {size!r} exceeds the "
                          f"{len(binary) - offset} bytes of binary data left")
    chunk = binary[offset:offset + size]
    return from_bytes(name, chunk, shape, count, dtype), offset + size


def _fits(name: str, shape: tuple[int, ...], count: int, dtype: np.dtype, sent: int) -> None:
    """Refuse a shape that declares more elements than `sent` bytes can hold (a BYTES
    element takes at least its 4-byte length), before anything is allocated for it."""
    strings = dtype.kind == "O"
    least = count * (4 if strings else dtype.itemsize)
    if (least > sent) if strings else (least != sent):
        what = "at least " if strings else ""
        raise TensorError(f"input {name!r}: shape {list(shape)} of {datatype(dtype)} takes "
                          f"{what}{least} bytes, binary_data_size is {sent}")


# What JSON values each kind of datatype takes, by the kind numpy reads them as: BOOL true
# and false, integers whole numbers, floats any number, BYTES strings (as Triton takes them)
_JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf", "O": "U"}
_JSON_NAMES = {"b": "true or false", "i": "whole numbers", "u": "whole numbers",
               "f": "numbers with fractions", "U": "strings"}


def _from_json(name: str, data: Any, shape: tuple[int, ...], count: int, dtype: np.dtype
               ) -> np.ndarray:
    """The data as `dtype`, refused unless every value is of the JSON type the datatype
    takes and in its range: numpy alone would turn "false" into True and 1.7 into 1."""
    if not isinstance(data, list):
        raise TensorError(f"input {name!r}: 'data' must be a list")
    try:
        given = np.array(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise TensorError(f"input {name!r}: data is not {datatype(dtype)}: "
                          f"{str(exc).splitlines()[0]}") from None
    if given.size != count:
        raise TensorError(f"input {name!r}: shape {list(shape)} holds {count} elements, "
                          f"data has {given.size}")
    if given.dtype.kind == "f" and dtype.kind in "iu":  # numpy reads whole numbers past
        exact = np.array(data, dtype=object)  # int64's range as floats; Python's ints keep them
        if all(type(v) is int for v in exact.flat):
            try:
                given = exact.astype(dtype)
            except OverflowError:
                raise TensorError(f"input {name!r}: data is not {datatype(dtype)}: it holds "
                                  f"values out of its range") from None
    if count and given.dtype.kind not in _JSON_KINDS[dtype.kind]:
        held = _JSON_NAMES.get(given.dtype.kind, "null or values of mixed types")
        raise TensorError(f"input {name!r}: data is not {datatype(dtype)}: it holds {held}")
    if count and dtype.kind in "iu" and (
            given.min() < np.iinfo(dtype).min or given.max() > np.iinfo(dtype).max):
        raise TensorError(f"input {name!r}: data is not {datatype(dtype)}: it holds values "
                          f"from {given.min()} to {given.max()}")
    return given.astype(dtype).reshape(shape)


def from_bytes(name: str, chunk: memoryview, shape: tuple[int, ...], count: int,
                dtype: np.dtype) -> np.ndarray:
    _fits(name, shape, count, dtype, len(chunk))
    if dtype.kind == "O":
        return _bytes_elements(name, chunk, count).reshape(shape)
    little = np.frombuffer(chunk, dtype=dtype.newbyteorder("<"), count=count)
    return little.astype(dtype, copy=False).reshape(shape)


def _bytes_elements(name: str, chunk: memoryview, count: int) -> np.ndarray:
    """BYTES binary data: each element a little-endian uint32 length, then its bytes,
    UTF-8 text."""
    data, end, at = bytes(chunk), len(chunk), 0
    elements = [""] * count
    for i in range(count):
        if at + 4 > end:
            raise TensorError(f"input {name!r}: BYTES data ends inside element {i}")
        (size,) = _LENGTH(data, at)
        at += 4
        if at + size > end:
            raise TensorError(f"input {name!r}: BYTES element {i} claims {size} bytes, "
                              f"{end - at} remain")
        try:  # onnxruntime takes text; bytes it would store as their repr, "b'...'"
            elements[i] = data[at:at + size].decode()
        except UnicodeDecodeError:
            raise TensorError(f"input {name!r}: BYTES element {i} is not UTF-8 text") from None
        at += size
    if at != end:
        raise TensorError(f"input {name!r}: {end - at} bytes follow its {count} "
                          f"BYTES elements")
    out = np.empty(count, dtype=object)
    out[:] = elements
    return out


def _raw(body: bytes, inputs: Sequence[InputSpec]) -> InferRequest:
    """A raw binary request: the one input's bytes, its one variable dimension deduced."""
    spec = inputs[0] if len(inputs) == 1 else None
    dtype = spec.dtype if spec is not None else None
    if spec is None or dtype is None or spec.dims is None or dtype.kind == "O":
        raise TensorError("a raw binary request (Inference-Header-Content-Length: 0) needs a "
                          "model with one numeric input")
    fixed = [d if isinstance(d, int) else None for d in spec.dims or ()]
    known = math.prod(d for d in fixed if d is not None) * dtype.itemsize
    free = fixed.count(None)
    if free > 1 or known == 0 or len(body) % known or (not free and len(body) != known):
        raise TensorError(f"a raw body of {len(body)} bytes does not fit input {spec.name!r} "
                          f"({spec.describe()})")
    shape = tuple(d if d is not None else len(body) // known for d in fixed)
    array = from_bytes(spec.name, memoryview(body), shape, math.prod(shape), dtype)
    return InferRequest({spec.name: array}, None, True, DEFAULT_PRIORITY, None)


def check_outputs(model: str, request: InferRequest, names: Sequence[str]) -> None:
    """TensorError if the request asks for an output the model does not have: said before
    the run, as Triton does, so a request that cannot be answered runs nothing."""
    missing = [n for n in request.outputs or () if n not in names]
    if missing:
        raise TensorError(f"{model} has no output {missing[0]!r}; outputs are "
                          f"{', '.join(map(repr, names))}")


def encode_response(model: str, version: str, request: InferRequest,
                    outputs: Mapping[str, np.ndarray]) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary tensors follow it."""
    wanted = request.outputs  # names the model has (`check_outputs`, before the run)
    described, blobs = [], []
    for name, value in outputs.items():
        if wanted is not None and name not in wanted:
            continue
        array = np.asarray(value, order="C")  # not ascontiguousarray: it makes a scalar 1-d
        entry: dict[str, Any] = {"name": name, "datatype": datatype(array.dtype),
                                 "shape": list(array.shape)}
        if wanted[name] if wanted is not None else request.binary_default:
            blob = to_bytes(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(array)
        described.append(entry)
    response: dict[str, Any] = {"model_name": model, "model_version": version,
                                "outputs": described}
    if request.id is not None:
        response["id"] = request.id
    header = orjson.dumps(response, option=_JSON_OPTIONS)
    if not blobs:
        return header, None
    return b"".join((header, *blobs)), len(header)


def on_the_wire(outputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """The outputs as tensors the protocol carries: an ONNX sequence, map or empty optional
    (which no datatype names; Triton refuses to load such a model) becomes BYTES of JSON
    text, one element per item of a sequence (a scikit-learn classifier's ZipMap: one
    {class: probability} per row), one for a map, none for an empty optional."""
    if all(isinstance(v, np.ndarray) for v in outputs.values()):
        return outputs
    return {n: v if isinstance(v, np.ndarray) else _json_texts(v) for n, v in outputs.items()}


def _json_texts(value: Any) -> np.ndarray:
    items = [] if value is None else value if isinstance(value, list) else [value]
    out = np.empty(len(items), dtype=object)
    out[:] = [orjson.dumps(item, option=_JSON_OPTIONS | orjson.OPT_NON_STR_KEYS)
              for item in items]
    return out


def _json_data(array: np.ndarray) -> Any:
    if array.dtype.kind in "OUS":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                for v in array.ravel().tolist()]
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        # orjson writes NaN and infinities as null; Triton writes NaN, Infinity, -Infinity
        return orjson.Fragment(json.dumps(array.ravel().tolist()))
    return array.ravel()  # orjson writes numpy arrays itself


def to_bytes(array: np.ndarray) -> bytes:
    """A tensor's binary data: little-endian values, or BYTES elements each a 4-byte
    length then the text."""
    if array.dtype.kind not in "OUS":
        return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    parts: list[bytes] = []
    for v in array.ravel().tolist():
        raw = v if isinstance(v, bytes) else str(v).encode()
        parts += (len(raw).to_bytes(4, "little"), raw)
    return b"".join(parts)
