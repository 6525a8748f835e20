"""Static quantization with onnxruntime.quantization: prepare, profile, quantize.

Glow's two phases. `profile` runs the prepared float model over calibration samples
and records each tensor's range (onnxruntime's calibrators: MinMax, Entropy,
Percentile) in onnxruntime's own calibration-cache JSON; `quantize` turns the model
into int8 from those ranges without running it again. Both start from `prepare`
(onnxruntime's pre-processing: shape inference and the basic graph optimisations, so
a BatchNormalization is folded into its Conv first), so the names in a profile are
those of the prepared model.

Defaults, chosen by measurement on this kind of machine (AVX-512 VNNI, one thread,
see docs/performance.md): QDQ format, uint8 activations, int8 weights per channel, and
convolutions on fewer than 8 input channels left in float (`narrow.py`), the int8
tensor after such a float region handed on channels-last (`layout.py`). int8
activations ran at about half the float speed here, uint8 ones 1.6-1.8x faster;
QOperator and QDQ ran alike, and QDQ keeps the float ops visible to the partitioner.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import math
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from runtime.devices.external import save
from runtime.devices.ort.sessions import cpu_session
from runtime.errors import ModelLoadError, ProvisionError
from runtime.graph import (
    Graph,
    body_ops,
    copy_initializer,
    default_opset,
    external_data,
    holds_half,
    load_graph,
    name_nodes,
    sort_nodes,
    unlist_initializers,
)
from runtime.names import fresh_name
from runtime.onnx_kinds import DEFAULT_DOMAINS
from runtime.opset_raise import raise_opset
from runtime.precision import DEQUANTIZE_OPS, QUANTIZE_OPS
from runtime.quantize.data import QuantizeError, Samples
from runtime.quantize.layout import channels_last_handoff
from runtime.quantize.narrow import slow_in_int8

FORMATS = ("qdq", "qoperator")
TYPES = ("uint8", "int8")
METHODS = ("minmax", "entropy", "percentile")
Progress = Callable[[int, int], None]  # (done, total)


@dataclass(frozen=True)
class QuantizeOptions:
    format: str = "qdq"
    activations: str = "uint8"
    weights: str = "int8"
    per_channel: bool = True
    exclude_nodes: tuple[str, ...] = ()  # kept in float
    exclude_ops: tuple[str, ...] = ()  # op types kept in float
    narrow_float: bool = True  # keep narrow convolutions (and what follows) in float

    def __post_init__(self) -> None:
        for key, value, allowed in (("format", self.format, FORMATS),
                                    ("activations", self.activations, TYPES),
                                    ("weights", self.weights, TYPES)):
            if value not in allowed:
                raise QuantizeError(f"{key} must be one of {', '.join(allowed)}, got {value!r}")

    def excluding(self, nodes: Sequence[str]) -> QuantizeOptions:
        return replace(self, exclude_nodes=tuple(dict.fromkeys((*self.exclude_nodes, *nodes))))

    def float_nodes(self, graph: Graph) -> list[str]:
        """The nodes kept in float by name: those asked for, the narrow ones, and with
        per-channel weights each grouped ConvTranspose (onnxruntime's quantizer scales its
        weight per channel of one group, fewer than its bias has, and fails)."""
        narrow = slow_in_int8(graph) if self.narrow_float else []
        grouped = [n.name for n in graph.nodes if n.op_type == "ConvTranspose"
                   and n.attributes.get("group", 1) > 1] if self.per_channel else []
        return list(dict.fromkeys((*self.exclude_nodes, *narrow, *grouped)))


DEFAULTS = QuantizeOptions()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime.quantization logs warnings (pre-processing advice), prints progress and
    lets numpy warn (a range of NaN in a float16 model); the sessions it makes log
    onnxruntime's own warnings and errors (a failure reaches the caller as a
    QuantizeError). Its default logger goes back to onnxruntime's default, warnings (it
    has no getter)."""
    import onnxruntime

    level = logging.root.manager.disable
    logging.disable(logging.WARNING)
    onnxruntime.set_default_logger_severity(4)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=RuntimeWarning, module="onnxruntime")
            yield
    finally:
        logging.disable(level)
        onnxruntime.set_default_logger_severity(2)


def _ort():
    import onnxruntime.quantization as q  # imported when used: it is slow to import

    return q


def quantizable_ops(fmt: str = "qdq") -> frozenset[str]:
    """Op types onnxruntime's static quantizer quantizes in this format. QDQ wraps any op
    it is given in Q/DQ pairs, so it takes onnxruntime's own default list (both its
    registries: Add, Mul, GlobalAveragePool... are only in the QOperator one); QOperator
    quantizes only the ops that have a QLinear form."""
    from onnxruntime.quantization import registry

    qlinear = frozenset(registry.QLinearOpsRegistry)
    return qlinear if fmt == "qoperator" else qlinear | frozenset(registry.QDQRegistry)


PER_CHANNEL_OPSET = 13  # DequantizeLinear's `axis`, per-channel scales, is from opset 13
SYMBOLIC_INFERENCE = "onnxruntime.tools.symbolic_shape_infer"
# Where that inference, when it cannot finish, saves what it has before it raises: in the
# working directory, with its weights in a file beside it
SYMBOLIC_LEFTOVER = Path("sym_shape_infer_temp.onnx")


def _raised_in_symbolic_inference(exc: BaseException) -> bool:
    return any(frame.f_globals.get("__name__") == SYMBOLIC_INFERENCE
               for frame, _ in traceback.walk_tb(exc.__traceback__))


def _pre_process(src: Path, out: Path, large: bool) -> None:
    """onnxruntime's quant_pre_process, its symbolic shape inference skipped where sympy is
    missing or where that inference raises: it does on some valid models (an op it has no
    rule for, such as a ReduceMax with its axes as an input, leaves a shape unknown that
    the next rule reads). ONNX's shape inference still runs after it, and onnxruntime's
    quantizer runs it again; the symbolic one mostly adds symbolic dims for transformers.
    `large`: past 2 GB, its tensors written beside it."""
    q = _ort()
    symbolic = importlib.util.find_spec("sympy") is not None
    ours = not SYMBOLIC_LEFTOVER.exists()  # what it leaves there is ours to remove
    outside = {"save_as_external_data": True, "all_tensors_to_one_file": True,
               "external_data_location": f"{out.name}.data"} if large else {}
    try:
        q.quant_pre_process(str(src), str(out), skip_symbolic_shape=not symbolic, **outside)
    except Exception as exc:  # onnxruntime raises plain Exceptions
        if not (symbolic and _raised_in_symbolic_inference(exc)):
            raise
        if ours:
            _remove_leftover()
        q.quant_pre_process(str(src), str(out), skip_symbolic_shape=True, **outside)


def _remove_leftover() -> None:
    """SYMBOLIC_LEFTOVER and the weights file it names, if there."""
    with contextlib.suppress(OSError, ValueError):  # none there, or not a model: not ours
        model = onnx.load(str(SYMBOLIC_LEFTOVER), load_external_data=False)
        for info in external_data(model):
            (SYMBOLIC_LEFTOVER.parent / info.location).unlink(missing_ok=True)
    SYMBOLIC_LEFTOVER.unlink(missing_ok=True)


def _upsample_hint(model: onnx.ModelProto) -> str:
    """What to do where onnxruntime's pre-processing fails on an Upsample below opset 10
    (the model stayed there, `_per_channel_opset`): it writes a Resize into the model at
    its own opset, which onnx's version converter then cannot raise."""
    version = default_opset(model)
    if version is None or version > 9 or all(n.op_type != "Upsample" for n in model.graph.node):
        return ""
    return (f" (onnxruntime's pre-processing cannot raise an Upsample at opset {version}; "
            f"export the model at opset 11 or later)")


def _per_channel_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model converted up to opset 13 (onnx's version converter) where it is below.
    Per-channel QDQ, the default, writes DequantizeLinear with `axis`, which older opsets
    lack; onnxruntime's documentation asks for opset 13 for it, and its quantizer itself
    converts a model up to the opset a requested type needs rather than refuse it (11
    below 10, 19 for float8, 21 for 16-bit and block-wise), so a user of it expects the
    conversion, not an error. It is raised before onnxruntime's pre-processing, which
    writes an Upsample below opset 10 as a Resize that the converter cannot raise
    (torchvision's LR-ASPP exported at opset 9). Where the converter fails, the model
    keeps its opset: per tensor and QOperator still quantize it, and `quantize` says so
    where per-channel QDQ then makes an invalid model."""
    version = default_opset(model)
    if version is None or version >= PER_CHANNEL_OPSET:
        return model
    try:
        return raise_opset(model, PER_CHANNEL_OPSET)
    except Exception:  # the converter raises plain RuntimeErrors and checker errors
        return model


def prepare(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    """Up to the opset per-channel QDQ needs, then onnxruntime's pre-processing, its nodes
    named; first, whether there is work for it (`_has_work`: its pre-processing fails on
    some models with nothing to quantize, an XGBoost classifier, in its own words)."""
    with tempfile.TemporaryDirectory(prefix="prism-quant-") as tmp, _quiet():
        src = Path(tmp) / "in.onnx"
        source = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        _has_work(source, sorted(quantizable_ops()), str(model) if isinstance(
            model, str | Path) else source.graph.name or "the model")
        raised = _per_channel_opset(source)
        large = save(unlist_initializers(raised, in_place=raised is not model), str(src))
        out = Path(tmp) / "prepared.onnx"
        try:
            _pre_process(src, out, large)
        except Exception as exc:
            raise QuantizeError(f"onnxruntime cannot prepare the model for quantization: "
                                f"{' '.join(str(exc).split())[:300]}{_upsample_hint(raised)}"
                                ) from None
        prepared = onnx.load(str(out))
        name_nodes(prepared.graph)  # as its graph names them: what exclusions name
        own_biases(prepared.graph)
        return prepared


# ops whose bias (input 2) onnxruntime's quantizer scales by the node's own input and weight
_BIASED = frozenset({"Conv", "ConvTranspose", "Gemm", "InstanceNormalization",
                     "LayerNormalization", "BatchNormalization"})


def own_biases(graph: onnx.GraphProto) -> None:
    """Each node whose bias onnxruntime's quantizer scales reads a bias initializer of its
    own, in place. Its quantizer copies a shared bias itself, naming the copy by appending
    a number, and a dynamo export may hold that name already (timm's PoolFormer: `val_12`,
    the bias of 24 InstanceNormalizations, copied to `val_124`, a Reshape's output): it
    then failed ("shared mode is not supported for weight"). A Gemm's bias of shape
    [1, N], which onnxruntime's pre-processing writes fusing a MatMul and an Add (Magika),
    is its own of shape [N], the same to Gemm: the quantizer's per-channel bias check
    takes one number per channel and failed on the row ("truth value of an array")."""
    inits = {t.name: t for t in graph.initializer}
    taken = {*inits, *(i.name for i in graph.input),
             *(t for n in graph.node for t in (*n.input, *n.output))}
    biases: set[str] = set()
    for node in graph.node:
        bias = node.input[2] if (node.op_type in _BIASED and node.domain in DEFAULT_DOMAINS
                                 and len(node.input) > 2) else ""
        row = node.op_type == "Gemm" and bias in inits and len(inits[bias].dims) == 2 and \
            inits[bias].dims[0] == 1
        if bias in biases or row:
            node.input[2] = fresh_name(f"{bias}/{node.name}", taken)
            copy_initializer(graph, inits[bias], node.input[2])
            if row:
                del graph.initializer[-1].dims[0]
        elif bias in inits:
            biases.add(bias)


class _Reader:
    """onnxruntime's CalibrationDataReader over Samples, ticking a progress callback."""

    def __init__(self, samples: Samples, progress: Progress | None):
        self.batches, self.done = samples.batches(), 0
        self.total, self.progress = samples.runs(), progress

    def get_next(self) -> dict | None:
        batch = next(self.batches, None)
        if batch is not None and self.progress:
            self.done += 1
            self.progress(self.done, self.total)
        return batch


def _method(name: str):
    if name not in METHODS:
        raise QuantizeError(f"calibration method must be one of {', '.join(METHODS)}, "
                            f"got {name!r}")
    return getattr(_ort().CalibrationMethod, {"minmax": "MinMax", "entropy": "Entropy",
                                              "percentile": "Percentile"}[name])


def profile(prepared: onnx.ModelProto, samples: Samples, path: str | Path,
            method: str = "minmax", progress: Progress | None = None) -> int:
    """Run the prepared model over the samples and write each tensor's range to `path`
    (onnxruntime's calibration cache); returns how many tensors it holds."""
    q = _ort()
    kind = _method(method)
    ops = sorted(quantizable_ops())
    with tempfile.TemporaryDirectory(prefix="prism-profile-") as tmp, _quiet():
        model_path = Path(tmp) / "model.onnx"
        large = save(prepared, str(model_path))
        try:
            calibrator = q.create_calibrator(model_path, ops, augmented_model_path=str(
                Path(tmp) / "augmented.onnx"), calibrate_method=kind,
                use_external_data_format=large)
            calibrator.collect_data(_Reader(samples.even(), progress))
            ranges = calibrator.compute_data()
        except Exception as exc:  # onnxruntime's own errors, in its own words
            raise QuantizeError(f"onnxruntime's calibration of {prepared.graph.name or 'the model'}"
                                f" failed: {' '.join(str(exc).split())[:300]}") from None
        if not ranges.data:  # silero's VAD: the work lies in an If on the sample rate
            raise QuantizeError(f"onnxruntime's calibration of {prepared.graph.name or 'the model'}"
                                f" ranged no tensor: the ops it quantizes read no float tensor "
                                f"outside If, Loop and Scan bodies, which it does not calibrate")
        q.save_tensors_data(ranges, Path(path))
    return len(ranges.data)


QUANTIZED_OPS = QUANTIZE_OPS | DEQUANTIZE_OPS | {"QLinearConv", "QLinearMatMul",
                                                  "MatMulInteger", "ConvInteger"}


def _has_work(model: onnx.ModelProto, ops: Sequence[str], label: str) -> None:
    """QuantizeError, before anything runs, for a model quantized already (its
    profile would miss what its QuantizeLinear nodes read) or with no node of a type
    onnxruntime quantizes (a scikit-learn forest): its profile would hold no range."""
    present = sorted({op for _, op in body_ops(model.graph)})
    if done := sorted(QUANTIZED_OPS.intersection(present)):
        raise QuantizeError(f"{label} is quantized already: it holds "
                            f"{' and '.join(done[:2])} nodes; quantize its float original")
    if not set(ops) & set(present):
        raise QuantizeError(f"{label} has nothing to quantize: none "
                            f"of its ops ({', '.join(present[:8])}{', ...' * (len(present) > 8)}) "
                            f"is one onnxruntime quantizes ({', '.join(ops[:6])}, ...)")


@dataclass(frozen=True)
class Profile:
    """What quantizing reads of a profile besides its ranges: its calibration method's
    name, and the tensors whose range is not finite (a log of 0 that a Where masks later,
    as in MPNet's relative position buckets): quantized, such a tensor's scale would be
    inf or NaN and every value through it NaN, so the nodes reading or writing it stay in
    float."""

    method: str
    unbounded: frozenset[str]


def _finite(value: object) -> bool:
    """Is every number in a range's record (JSON lists and dicts) finite?"""
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def read_profile(path: str | Path, graph: Graph) -> Profile:
    """Check a profile against the prepared model, and read what quantizing needs of it
    beside the ranges."""
    try:
        raw = json.loads(Path(path).read_text())
        method = raw["calibration_method"]
        tensors = set(raw["data"])
        unbounded = frozenset(t for t, r in raw["data"].items() if not _finite(r))
    except FileNotFoundError:
        raise QuantizeError(f"profile not found: {path}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise QuantizeError(f"{path} is not a profile from `prism profile` ({exc})") from None
    strangers = sorted(tensors - set(graph.tensors))
    if strangers:
        raise QuantizeError(f"profile {path} does not belong to {graph.name}: it has a range "
                            f"for tensor {strangers[0]!r}, which {graph.name} lacks")
    # none for an input is no sign of a stranger: onnxruntime calibrates only what its
    # quantized ops read, not a text model's integer ids nor an image ConvNeXt first
    # normalizes with a Sub
    if not tensors:
        raise QuantizeError(f"profile {path} does not belong to {graph.name}: it has no range "
                            f"for any tensor")
    name = str(method.get("value", "") if isinstance(method, dict) else method)
    return Profile(name.rsplit(".", 1)[-1].lower(), unbounded)


def quantize(prepared: onnx.ModelProto, profile_path: str | Path,
             options: QuantizeOptions = DEFAULTS) -> onnx.ModelProto:
    """The prepared model in int8 from a profile's ranges (no calibration run), each
    float region's int8 output handed on channels-last where that saves transposes."""
    q = _ort()
    graph = load_graph(prepared)
    profiled = read_profile(profile_path, graph)
    unknown = sorted(set(options.exclude_nodes) - set(graph.by_name))
    if unknown:
        raise QuantizeError(f"cannot keep {unknown[0]!r} in float: no such node in "
                            f"{graph.name} (after onnxruntime's pre-processing)")
    ops = sorted(quantizable_ops(options.format) - set(options.exclude_ops))
    kept = [*options.float_nodes(graph), *_touching(graph, profiled.unbounded),
            *shape_arithmetic(prepared.graph)]
    types = {"uint8": q.QuantType.QUInt8, "int8": q.QuantType.QInt8}
    with tempfile.TemporaryDirectory(prefix="prism-quant-") as tmp, _quiet():
        src, out = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        large = save(prepared, str(src))
        try:
            q.quantize_static(
                str(src), str(out), None, calibration_cache_path=str(profile_path),
                calibrate_method=_method(profiled.method), op_types_to_quantize=ops,
                quant_format=q.QuantFormat.QDQ if options.format == "qdq"
                else q.QuantFormat.QOperator, per_channel=options.per_channel,
                activation_type=types[options.activations], weight_type=types[options.weights],
                nodes_to_exclude=kept, use_external_data_format=large)
        except Exception as exc:
            raise QuantizeError(f"onnxruntime could not quantize {graph.name}: "
                                f"{' '.join(str(exc).split())[:300]}") from None
        model = onnx.load(str(out))
        sort_nodes(model.graph)  # its own sort misses what a Loop's body reads around it
        try:
            model = channels_last_handoff(model)
            cpu_session(model)  # onnxruntime types the graph its quantizer wrote
        except ModelLoadError as exc:
            raise QuantizeError(_invalid_output(str(exc).removeprefix("model"), graph,
                                                options)) from None
        except ProvisionError as exc:
            why = str(exc).partition(" on CPU: ")[2] or str(exc)
            raise QuantizeError(_invalid_output(f" does not load in onnxruntime: {why}", graph,
                                                options)) from None
        return model


def shape_arithmetic(graph: onnx.GraphProto) -> list[str]:
    """The nodes computing from tensors' shapes and constants alone: settings such as a
    Resize's scales, which an export below opset 11 computes in float (Shape, Gather,
    Cast, Div, Concat). Quantized as values, [1, 1, 8, 8] came back as 0.99 and 8.03, and
    the int8 model failed at its first run."""
    settled = {t.name for t in graph.initializer}  # what no input's values move
    out = []
    for node in graph.node:
        if node.op_type in ("Shape", "Size") or settled.issuperset(t for t in node.input if t):
            settled.update(node.output)
            out.append(node.name)
    return out


def _touching(graph: Graph, tensors: frozenset[str]) -> list[str]:
    """The nodes reading or writing any of `tensors`."""
    return [n.name for n in graph.nodes if tensors.intersection(n.reads + n.writes)]


def _invalid_output(why: str, prepared: Graph, options: QuantizeOptions) -> str:
    """Why the int8 model fails to load, in words that blame it, not the user's model
    (load_graph calls a model given in memory "model"), and what still quantizes where
    the prepared model stayed below the opset per-channel QDQ needs, or held float16
    (onnxruntime's quantizer writes float16 scales where its DequantizeLinear reads
    float32 ones, in some ConvNeXt and T5 exports)."""
    message = f"the int8 model onnxruntime made of {prepared.name}{why}"
    if holds_half(prepared.model):
        message += (f" ({prepared.name} holds float16; quantize a float32 export of it "
                    f"instead)")
    version = default_opset(prepared.model)
    if (options.format == "qdq" and options.per_channel and version is not None
            and version < PER_CHANNEL_OPSET):
        message += (f" (per-channel QDQ needs opset {PER_CHANNEL_OPSET}; {prepared.name} stayed "
                    f"at opset {version}, which onnx's version converter could not raise: "
                    f"quantize per tensor or in the QOperator format)")
    return message


@dataclass
class Calibrated:
    """A prepared model and its profile on disk, for quantizing it again and again."""

    prepared: onnx.ModelProto
    profile_path: Path
    tensors: int
    _tmp: tempfile.TemporaryDirectory | None = field(repr=False, default=None)

    def quantize(self, options: QuantizeOptions = DEFAULTS) -> onnx.ModelProto:
        return quantize(self.prepared, self.profile_path, options)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Calibrated:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def calibrate(model: onnx.ModelProto | str | Path, samples: Samples, method: str = "minmax",
              progress: Progress | None = None) -> Calibrated:
    """Prepare and profile in one go, the profile kept in a temporary folder."""
    prepared = prepare(model)
    tmp = tempfile.TemporaryDirectory(prefix="prism-calib-")
    path = Path(tmp.name) / "profile.json"
    tensors = profile(prepared, samples, path, method, progress)
    return Calibrated(prepared, path, tensors, tmp)
