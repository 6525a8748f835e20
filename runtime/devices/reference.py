"""`reference` backend: onnx.reference.ReferenceEvaluator, pure numpy."""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from runtime.devices.backends import register, schema_function_ops
from runtime.devices.config import DeviceConfig
from runtime.devices.device import Program
from runtime.devices.external import inline_external
from runtime.devices.manager import DeviceManager
from runtime.devices.reference_ops import KERNELS
from runtime.errors import ProvisionError, first_line
from runtime.onnx_kinds import DEFAULT_DOMAINS

# What numpy warns of inside the evaluator's kernels (a complex value cast to real, say)
# is the data's business, as in onnxruntime, which says nothing; a filter on the
# kernels' modules rather than catch_warnings, which is not thread-safe.
warnings.filterwarnings("ignore", module=r"onnx\.reference\.")


def evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    """onnx's evaluator of `model`, with our kernels where its own are wrong."""
    return ReferenceEvaluator(model, new_ops=list(KERNELS))


class ReferenceFunction:
    def __init__(self, evaluator: ReferenceEvaluator):
        self.evaluator = evaluator
        self.output_names = tuple(evaluator.output_names)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Overflow or NaN in a kernel is the data's business, as in onnxruntime, which
        # says nothing: numpy's warnings would land on the user's terminal.
        with np.errstate(all="ignore"):
            results = self.evaluator.run(None, feeds)
        return {name: _value(value)
                for name, value in zip(self.output_names, results, strict=True)}


def _value(value: object) -> Any:
    """Scalars as 0-d arrays; text as onnxruntime gives it, objects (the evaluator's are
    numpy's fixed-width text: a classifier's string labels); sequences (lists), maps and
    empty optionals (None) as they are."""
    if value is None or isinstance(value, list | tuple | dict):
        return value
    array = np.asarray(value)
    return array.astype(object) if array.dtype.kind in "US" else array


def compile_reference(program: Program, config: DeviceConfig) -> ReferenceFunction:
    try:
        model = inline_external(onnx.load_from_string(program.model), program.external)
        return ReferenceFunction(evaluator(model))
    except Exception as exc:
        raise ProvisionError(f"{config.name}: the reference evaluator cannot load "
                             f"{program.name or 'model'}: {first_line(exc)}") from exc


def reference_device(config: DeviceConfig, bus: Any = None) -> DeviceManager:
    return DeviceManager(config, compile_reference, bus)


def reference_ops() -> frozenset[str] | None:
    """The evaluator's registered op classes plus schema function ops (it expands those)."""
    try:
        from onnx.reference.ops._op_list import _build_registered_operators

        registered = set(_build_registered_operators())
    except (ImportError, AttributeError):
        return None
    registered -= {"OpRun", "OpFunction"}
    return frozenset(registered | schema_function_ops())


_DOMAIN_OPS = {  # the evaluator's op lists outside the default domain, by module
    "ai.onnx.ml": "aionnxml",
    "ai.onnx.preview": "aionnx_preview",
    "ai.onnx.preview.training": "aionnx_preview_training",
    "experimental": "experimental",
}


@functools.cache
def domain_ops(domain: str) -> frozenset[str]:
    module = _DOMAIN_OPS.get(domain)
    if module is None:
        return frozenset()
    try:
        ops = importlib.import_module(f"onnx.reference.ops.{module}._op_list")
        registered = set(ops._build_registered_operators())
    except (ImportError, AttributeError):
        return frozenset()
    return frozenset(registered - {"OpRun", "OpFunction"})


_OWN = frozenset((k.op_domain, k.__name__) for k in KERNELS)  # `reference_ops`' kernels


def reference_accepts(node, graph) -> str | None:
    """Default-domain ops go by the op list; other domains by the evaluator's list for
    that domain (a model's own functions are inlined at load)."""
    if node.domain in DEFAULT_DOMAINS:
        return None
    if node.op_type in domain_ops(node.domain) or (node.domain, node.op_type) in _OWN:
        return None
    return f"the reference evaluator has no {node.domain}.{node.op_type}"


register("reference", reference_device, reference_ops, reference_accepts)
