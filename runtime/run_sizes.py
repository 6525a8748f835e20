"""Sizes shape inference cannot give, read from one onnxruntime run of the model.

    sizes = run_sizes(bound_model, ["/Loop_output_0"])   # name -> (dtype, shape)

Outputs of a `Loop` or `Scan`, of ops from other domains, of a `Reshape` to a computed
shape: shape inference leaves some tensors without a shape, and a tensor of unknown
size would cost nothing to copy between devices or to hold. The model (its inputs bound
to the shapes the graph is costed at) runs once on made-up inputs with those tensors as
extra outputs: floats drawn from a normal distribution, integers and booleans 1 (a valid
index into any table of two rows, and a loop that runs once), strings empty. A model
that cannot run so (an input of no fixed shape or type, a kernel that refuses the values:
a one-hot encoder told to refuse an unknown category) gives no sizes, only the element
types onnxruntime gives those tensors as it loads the model, which a partition reading
one needs to declare it (onnx infers none for ai.onnx.ml's Scaler, say).

The sizes are kept in the user's cache (`kept_sizes`, `sizes/` in `runtime/user_cache.py`'s
directory), keyed by the model's bytes: a later load of a detection network reads them
rather than running it again (torchvision's Keypoint R-CNN: its graph loads in 1.3 s, not
13.5 s).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from runtime.stored import with_weights
from runtime.user_cache import cache_dir, read_entry, write_entry

Sizes = dict[str, tuple[np.dtype, tuple[int, ...] | None]]  # no shape: the type alone
FORMAT = 2  # kept sizes of an older format are not read: 2, types of a failed run


def made_up(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator,
            whole: int) -> np.ndarray | None:
    """A made-up tensor: floats from a normal distribution, integers and booleans `whole`,
    strings empty; None for any other kind."""
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iub":
        return np.full(shape, whole, dtype)
    return np.full(shape, "", dtype=object) if dtype.kind in "OU" else None


def _feed(value: onnx.ValueInfoProto, rng: np.random.Generator) -> np.ndarray | None:
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape") or any(
            not d.HasField("dim_value") for d in tensor.shape.dim):
        return None
    shape = tuple(d.dim_value for d in tensor.shape.dim)
    return made_up(np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)), shape, rng, 1)


def _numeric(ort_type: str) -> np.dtype | None:
    """The numpy dtype of onnxruntime's name of a tensor type of numbers ("tensor(float)")."""
    if not ort_type.startswith("tensor(") or not ort_type.endswith(")"):
        return None
    try:
        elem = onnx.TensorProto.DataType.Value(ort_type[7:-1].upper())
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except (ValueError, KeyError, TypeError):
        return None
    return dtype if dtype.kind in "biuf" else None


def run_sizes(model: onnx.ModelProto, names: Sequence[str], seed: int = 0,
              runs: bool = True) -> Sizes:
    """(dtype, shape) of each of `names` (top-level node outputs) that holds numbers, in
    one run of `model`, whose inputs have fixed shapes; where it cannot run (or `runs` is
    False), (dtype, None) as onnxruntime types them; {} if onnxruntime cannot load it."""
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    probe = with_weights(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    import onnxruntime as ort  # here: loading a graph whose sizes are all known needs none

    options = ort.SessionOptions()
    # unoptimized: with its dimensions bound, onnxruntime's optimizer aborts the process
    # on some models it loads unbound (a quantized Keras LSTM: a C++ assertion)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # best effort: a run that fails says nothing (stderr
    # is the CLI's one error line), nor do the added outputs
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
    except Exception:
        return {}
    with contextlib.suppress(Exception):
        feeds = {v.name: _feed(v, rng) for v in model.graph.input
                 if v.name not in initializers} if runs else None
        if feeds is not None and all(f is not None for f in feeds.values()):
            values = session.run(list(names), feeds)
            return {n: (v.dtype, v.shape) for n, v in zip(names, values, strict=True)
                    if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"}
    wanted = set(names)
    return {o.name: (dtype, None) for o in session.get_outputs()
            if o.name in wanted and (dtype := _numeric(o.type)) is not None}


def kept_sizes(model: onnx.ModelProto, names: Sequence[str], runs: bool = True) -> Sizes:
    """`run_sizes`, read from the user's cache when this model (its bytes, weights and all)
    was sized by this onnxruntime before, and kept there when it was not."""
    import onnxruntime as ort

    key = hashlib.sha256(model.SerializeToString(deterministic=True))
    key.update("\n".join(["", *names, ort.__version__, str(FORMAT), str(runs)]).encode())
    path = cache_dir() / "sizes" / f"{key.hexdigest()[:32]}.json"
    with contextlib.suppress(AttributeError, TypeError, ValueError):  # none kept, or damaged
        return {n: (np.dtype(d), None if s is None else tuple(map(int, s)))
                for n, (d, s) in read_entry(path).items()}
    sizes = run_sizes(model, names, runs=runs)
    write_entry(path, {n: [d.name, None if s is None else list(s)]
                       for n, (d, s) in sizes.items()})
    return sizes
