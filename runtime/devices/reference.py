"""`reference` backend: onnx.reference.ReferenceEvaluator, pure numpy."""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from runtime.devices.backends import first_line, register, schema_function_ops
from runtime.devices.config import DeviceConfig
from runtime.errors import ProvisionError


class ReferenceFunction:
    def __init__(self, evaluator: ReferenceEvaluator):
        self.evaluator = evaluator
        self.output_names = tuple(evaluator.output_names)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = self.evaluator.run(None, feeds)
        return {name: _value(value)
                for name, value in zip(self.output_names, results, strict=True)}


def _value(value: object) -> object:
    """Scalars as 0-d arrays; sequences (lists), maps and empty optionals (None) as they are."""
    if value is None or isinstance(value, np.ndarray | list | tuple | dict):
        return value
    return np.asarray(value)


def compile_reference(model: onnx.ModelProto, config: DeviceConfig,
                      est_seconds: float) -> ReferenceFunction:
    try:
        return ReferenceFunction(ReferenceEvaluator(model))
    except Exception as exc:
        raise ProvisionError(f"{config.name}: the reference evaluator cannot load "
                             f"{model.graph.name or 'model'}: {first_line(exc)}") from exc


def reference_ops() -> frozenset[str] | None:
    """The evaluator's registered op classes plus schema function ops (it expands those)."""
    try:
        from onnx.reference.ops._op_list import _build_registered_operators

        registered = set(_build_registered_operators())
    except (ImportError, AttributeError):
        return None
    registered -= {"OpRun", "OpFunction"}
    return frozenset(registered | schema_function_ops())


register("reference", compile_reference, reference_ops)
