"""Sizes onnx's shape inference leaves unknown at bound inputs, from onnxruntime's
symbolic shape inference.

onnx's inference does not follow a Reshape to a shape computed from `Shape` ops through
arithmetic it cannot propagate (TorchScript's attention, `[batch * heads, -1, head size]`,
and many of dynamo's): it names such dimensions `unk__N`, which binding made 1. So a
UNet's self-attention over 50,176 latent pixels was costed and planned as over one pixel,
and a run at those sizes was the first to meet its 80 GB of scores (killed for want of
memory).
onnxruntime's symbolic inference (what its transformer optimizer uses) follows them; it is
asked only where onnx's left a dimension unknown, its answers taken only where whole."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.util
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnxruntime
from google.protobuf.message import DecodeError
from onnx import helper

from runtime.large import LARGE_INIT, tensor_bytes
from runtime.user_cache import cache_dir, read_entry, write_entry

_ORT_RULES = Path(onnxruntime.__file__).parent / "tools" / "symbolic_shape_infer.py"
BUDGET_SECONDS = 1.0  # symbolic inference's time at most, per load
_GRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def sharpened(model: onnx.ModelProto, inferred: dict[str, onnx.ValueInfoProto]
              ) -> dict[str, onnx.ValueInfoProto]:
    """`inferred` (onnx's value infos of `model`, its inputs bound) with the tensors it left
    of unknown size sized by onnxruntime's symbolic inference, where that sizes them.
    `model` is a throwaway copy: its large weights become inputs."""
    unknown = [name for name, value in inferred.items() if not _sized(value)]
    if not unknown or any(node.attribute and any(a.type in _GRAPHS for a in node.attribute)
                          for node in model.graph.node):
        return inferred  # control flow: each body a new inference, which no budget bounds
    return inferred | _kept_sized(model, unknown)


def _kept_sized(model: onnx.ModelProto, unknown: list[str]) -> dict[str, onnx.ValueInfoProto]:
    """The `unknown` tensors symbolic inference sizes, read from the user's cache when this
    model (its graph and its weights' shells) met these rules before (`_rules`), else
    inferred and kept, unless it ran out of time (a busy machine's answer). A new process
    took 0.4 s to import sympy and infer GPT-2's attention sizes, 0.97 s its first load."""
    key = hashlib.sha256(model.SerializeToString(deterministic=True))
    key.update("\n".join(["", *unknown, _rules()]).encode())
    path = cache_dir() / "symbolic" / f"{key.hexdigest()[:32]}.json"
    with contextlib.suppress(AttributeError, TypeError, ValueError, DecodeError):  # damaged
        return {name: onnx.ValueInfoProto.FromString(base64.b64decode(text, validate=True))
                for name, text in read_entry(path).items()}
    try:
        out = _symbolic(_weights_as_inputs(model))
    except TimeoutError:
        return {}
    except Exception:  # best effort, as onnx's: what stays unknown is sized by a run
        found = {}
    else:
        values = {v.name: v for v in (*out.graph.value_info, *out.graph.output)}
        found = {name: values[name] for name in unknown
                 if name in values and _sized(values[name])}
    write_entry(path, {name: base64.b64encode(value.SerializeToString()).decode()
                       for name, value in found.items()})
    return found


@functools.cache
def _rules() -> str:
    """A digest of the rules that size: onnxruntime's inference, this module's own, and
    onnx's, which it asks of each node first."""
    # a build without its tools: inference fails there, and that is what is kept
    ort_rules = _ORT_RULES.read_bytes() if _ORT_RULES.is_file() else b""
    rules = ort_rules + Path(__file__).read_bytes() + onnx.__version__.encode()
    return hashlib.sha256(rules).hexdigest()


def _symbolic(model: onnx.ModelProto) -> onnx.ModelProto:
    """`SymbolicShapeInference.infer_shapes`, step by step as it takes them: where some
    shape stays unknown it saves the model into the working directory and raises, and
    what it did size is the answer here. Each node's step checks `BUDGET_SECONDS`: on a
    detection network it took minutes (torchvision's Faster R-CNN, 230 s), on a
    transformer a hundredth of a second."""
    symbolic = _symbolic_module()
    if (symbolic.get_opset(model) or 0) < 7:
        raise ValueError("symbolic inference takes opset 7 and above")
    inference = symbolic.SymbolicShapeInference(2**31 - 1, False, False, 0)  # int_max, ...
    for op, compute in _WHOLE_OPS.items():
        inference.dispatcher_.setdefault(op, functools.partial(_on_whole_numbers, inference,
                                                               compute))
    for op in _REDUCES:  # as it sizes ReduceMean's and ReduceSum's
        inference.dispatcher_.setdefault(op, inference._infer_ReduceMean)
    inference.dispatcher_["SplitToSequence"] = functools.partial(_split_to_sequence, inference)
    inference.dispatcher_.setdefault("Col2Im", functools.partial(_col2im, inference))
    inference.dispatcher_["Reshape"] = functools.partial(_scalar_kept, inference,
                                                         inference.dispatcher_["Reshape"])
    if gqa := inference.dispatcher_.get("GroupQueryAttention"):
        inference.dispatcher_["GroupQueryAttention"] = functools.partial(
            _present_as_long_as_total, inference, gqa)
    deadline = time.monotonic() + BUDGET_SECONDS

    def bounded(step: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            if time.monotonic() > deadline:
                raise TimeoutError(f"symbolic inference past {BUDGET_SECONDS} s")
            return step(*args)
        return run

    inference.dispatcher_ = {op: bounded(step) for op, step in inference.dispatcher_.items()}
    inference._onnx_infer_single_node = bounded(inference._onnx_infer_single_node)
    with _quiet(symbolic.logger):
        inference._preprocess(model)
        while inference.run_:
            inference._infer_impl()
    inference._update_output_from_vi()
    return inference.out_mp_


# ops whose values onnxruntime's inference does not compute, which dynamo's exports size
# patches and frames with (`h // 4`: a Div, then Sign, Mod, Equal, Not and And round it
# toward minus infinity): a Swin's tokens, and 93-99% of its activations' bytes, were
# left unknown
_WHOLE_OPS: dict[str, Callable[[list[int]], int]] = {
    "Sign": lambda v: (v[0] > 0) - (v[0] < 0), "Abs": lambda v: abs(v[0]),
    "Mod": lambda v: v[0] % v[1], "Not": lambda v: int(not v[0]),
    "And": lambda v: int(bool(v[0] and v[1])), "Or": lambda v: int(bool(v[0] or v[1]))}


# reductions whose axes became an input at opset 18, which onnxruntime's inference sizes
# for ReduceMean and ReduceSum alone: SigLIP's and OWL-ViT's ReduceL2 (a norm of their
# embeddings) was left of no rank, and inference stopped there
_REDUCES = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMin",
            "ReduceSumSquare")


def _on_whole_numbers(inference: Any, compute: Callable[[list[int]], int],
                      node: onnx.NodeProto) -> None:
    """The node's value, where its inputs' are whole numbers (a bound model's sizes; not
    symbols): `compute` over them, element by element."""
    values = inference._get_int_or_float_values(node, broadcast=True)
    flat = [w for value in values for w in _wholes(value)]
    fmod = any(a.name == "fmod" and a.i for a in node.attribute)  # C's remainder: not here
    if flat and not fmod and None not in flat:
        with contextlib.suppress(ZeroDivisionError):
            inference._compute_on_sympy_data(node, lambda vs: compute([int(v) for v in vs]))


def _present_as_long_as_total(inference: Any, infer: Callable[[onnx.NodeProto], None],
                              node: onnx.NodeProto) -> None:
    """onnxruntime's rule gives a GroupQueryAttention's present caches their past's length,
    as if one buffer held both; a run makes them max(past, total_sequence_length) long:
    onnxruntime-genai's decoders, 512 new tokens past 1, have caches of 513, not 1."""
    infer(node)
    value = inference._try_get_value(node, 6) if len(node.input) > 6 else None
    totals = _wholes(value) if value is not None else []
    total = totals[0] if len(totals) == 1 else None
    for name in node.output[1:3] if total is not None else ():
        dims = inference.known_vi_[name].type.tensor_type.shape.dim if name else []
        if len(dims) == 4 and dims[2].HasField("dim_value") and dims[2].dim_value < total:
            dims[2].dim_value = total


def _scalar_kept(inference: Any, infer: Callable[[onnx.NodeProto], None],
                 node: onnx.NodeProto) -> None:
    """onnxruntime's Reshape passes its input's value on zipped with the target shape's,
    so a size reshaped to a scalar (shape `[]`, as dynamo's exports make `sym_size` one)
    came out empty, and the Range up to it stopped inference (timm's DaViT)."""
    infer(node)
    value, shape = inference.sympy_data_.get(node.input[0]), inference._try_get_value(node, 1)
    if isinstance(value, list) and len(value) == 1 and shape is not None and len(shape) == 0:
        inference.sympy_data_[node.output[0]] = value[0]


def _split_to_sequence(inference: Any, node: onnx.NodeProto) -> None:
    """A SplitToSequence's sequence, its chunks' shape where they are alike. onnxruntime's
    rule calls an onnx helper gone in onnx 1.23 and writes one output per chunk: 10 of 75
    timm exports (torch's `split` and `unbind`) stopped inference there, up to 28% of their
    activations' bytes unseen."""
    shape = inference._get_sympy_shape(node, 0)
    attrs = {a.name: a.i for a in node.attribute}
    axis = _symbolic_module().handle_negative_axis(attrs.get("axis", 0), len(shape))
    split = inference._try_get_value(node, 1) if len(node.input) > 1 and node.input[1] else None
    chunk: int | None = 1  # no split: chunks of 1
    if split is not None:
        sizes = set(_wholes(split))
        chunk = sizes.pop() if len(sizes) == 1 else None  # chunks as listed, all alike
        whole = _whole(shape[axis])
        if np.ndim(split) == 0 and (whole is None or not chunk or whole % chunk):
            chunk = None  # chunks of `split`, the last the rest
    if split is None and not attrs.get("keepdims", 1):
        dims = [*shape[:axis], *shape[axis + 1:]]
    else:
        dims = [*shape[:axis], chunk if chunk is not None else
                inference._new_symbolic_dim_from_output(node, 0, axis), *shape[axis + 1:]]
    _type_output(inference, node, dims, sequence=True)


def _col2im(inference: Any, node: onnx.NodeProto) -> None:
    """A Col2Im's (torch's `nn.Fold`) image, `[N, C / prod(block), *image_shape]`, which
    onnxruntime's inference has no rule for: VOLO's batch became a symbol after it."""
    shape = inference._get_sympy_shape(node, 0)
    image, block = inference._try_get_value(node, 1), inference._try_get_value(node, 2)
    if image is None or block is None or len(shape) != 3:
        return
    channels = shape[1] // int(np.prod([int(b) for b in np.ravel(block)]))
    dims = [shape[0], channels, *(int(d) for d in np.ravel(image))]
    _type_output(inference, node, dims)


def _type_output(inference: Any, node: onnx.NodeProto, dims: list, sequence: bool = False
                 ) -> None:
    """The node's output typed as its first input's elements at `dims` (sympy's), or as a
    sequence of such tensors."""
    elem = inference.known_vi_[node.input[0]].type.tensor_type.elem_type
    tensor = helper.make_tensor_type_proto(elem,
                                           _symbolic_module().get_shape_from_sympy_shape(dims))
    inference.known_vi_[node.output[0]].CopyFrom(helper.make_value_info(
        node.output[0], helper.make_sequence_type_proto(tensor) if sequence else tensor))


def _wholes(value: Any) -> list[int | None]:
    """`_whole` of each element of a list, an array or a number."""
    return [_whole(v) for v in np.ravel(np.asarray(value, dtype=object))]


def _whole(value: Any) -> int | None:
    """A known whole number's value (a bound model's size); None for a symbol."""
    known = isinstance(value, int | np.integer) or getattr(value, "is_Integer", False)
    return int(value) if known else None


@functools.cache
def _symbolic_module() -> ModuleType:
    """onnxruntime's `tools/symbolic_shape_infer.py`, read from its file: imported by its
    name, it first runs the `onnxruntime.tools` package, which imports torch wherever torch
    is installed (0.9 s and 180 MB resident in every process that loads such a model)."""
    spec = importlib.util.spec_from_file_location("prism_symbolic_shape_infer", _ORT_RULES)
    assert spec is not None and spec.loader is not None, _ORT_RULES
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sized(value: onnx.ValueInfoProto) -> bool:
    tensor = value.type.tensor_type
    return not value.type.HasField("tensor_type") or (
        tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim))


def _weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (a shell: `large.inferable`), its large weights made typed inputs in place:
    symbolic inference reads every initializer's values, and a shell's hold none (the
    inference copies the model it is given: a copy here would be a second)."""
    kept = [t for t in model.graph.initializer if tensor_bytes(t) < LARGE_INIT]
    moved = [t for t in model.graph.initializer if tensor_bytes(t) >= LARGE_INIT]
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in moved)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


@contextlib.contextmanager
def _quiet(logger: logging.Logger):
    """Its warnings (ops it does not know, numpy's at a Slice of step 0) are not the
    user's: they would print at load."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with np.errstate(all="ignore"):
            yield
    finally:
        logger.setLevel(level)
