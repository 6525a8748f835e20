"""The names of a serialized ONNX model's graph inputs and outputs, read without onnx.

A bundle is checked before anything loads from it (`reader.Bundle.check`), and the
standalone driver imports neither onnx nor protobuf, so this walks the protobuf wire
format itself: ModelProto.graph (field 7), GraphProto.input (11) and .output (12), each a
ValueInfoProto whose name is field 1. Every other field is skipped by its length.
"""

from __future__ import annotations

_GRAPH, _INPUT, _OUTPUT, _NAME = 7, 11, 12, 1
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


class ProtoError(ValueError):
    """Not a well-formed protobuf message."""


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ProtoError("a varint runs past the end")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: memoryview):
    """(field number, bytes) of each length-delimited field; other wire types skipped."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, at = _varint(data, at)
        elif wire in (_FIXED64, _FIXED32):
            at += 8 if wire == _FIXED64 else 4
        elif wire == _BYTES:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ProtoError(f"field {number} runs past the end")
            yield number, data[at:at + size]
            at += size
        else:
            raise ProtoError(f"field {number} has wire type {wire}")
    if at != len(data):
        raise ProtoError("the last field runs past the end")


def graph_io(model: bytes) -> tuple[list[str], list[str]]:
    """(input names, output names) of the model's main graph; ProtoError if `model` is not
    a serialized ModelProto."""
    inputs: list[str] = []
    outputs: list[str] = []
    graphs = [value for number, value in _fields(memoryview(model)) if number == _GRAPH]
    if not graphs:
        raise ProtoError("it has no graph")
    for number, value in _fields(graphs[-1]):
        if number in (_INPUT, _OUTPUT):
            names = [bytes(v).decode() for n, v in _fields(value) if n == _NAME]
            (inputs if number == _INPUT else outputs).append(names[-1] if names else "")
    return inputs, outputs
