"""`cpu` backend: one onnxruntime CPU session per loaded function, built once at compile."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from runtime.devices.backends import register, schema_function_ops
from runtime.devices.config import DeviceConfig
from runtime.errors import ProvisionError
from runtime.submodel import cpu_session

_DEFAULT_DOMAINS = ("", "ai.onnx")


class OrtFunction:
    def __init__(self, session: ort.InferenceSession):
        self.session = session
        self.output_names = tuple(o.name for o in session.get_outputs())
        self._names = list(self.output_names)
        # The binding under InferenceSession.run: its Python wrapper re-checks feeds we
        # have already checked, which costs microseconds a small model notices.
        self._run = getattr(session, "_sess", None)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._run is not None:
            outputs = self._run.run(self._names, feeds, None)
        else:
            outputs = self.session.run(self._names, feeds)
        return dict(zip(self.output_names, outputs, strict=True))


def ort_function(model: onnx.ModelProto, config: DeviceConfig, threads: int) -> OrtFunction:
    try:
        return OrtFunction(cpu_session(model, threads))
    except ProvisionError as exc:
        raise ProvisionError(f"{config.name}: {exc}") from exc.__cause__


def compile_cpu(model: onnx.ModelProto, config: DeviceConfig, est_seconds: float) -> OrtFunction:
    return ort_function(model, config, config.threads)


def cpu_ops() -> frozenset[str] | None:
    """Op names with a CPU kernel, plus Constant (folded into an initializer at load) and
    onnx function ops up to the newest opset the kernels know (inlined at load)."""
    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import get_all_opkernel_def

        kernels = [k for k in get_all_opkernel_def()
                   if k.provider == "CPUExecutionProvider" and k.domain in _DEFAULT_DOMAINS]
    except (ImportError, AttributeError):
        return None
    if not kernels:
        return None
    newest = max(k.version_range[0] for k in kernels)
    return frozenset({k.op_name for k in kernels} | {"Constant"} | schema_function_ops(newest))


def cpu_accepts(node, graph) -> str | None:
    from runtime.devices.ort_kernels import ort_problem

    return ort_problem(node, graph)


register("cpu", compile_cpu, cpu_ops, cpu_accepts)
