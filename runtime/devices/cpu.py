"""`cpu` backend: one onnxruntime CPU session per loaded program, built once at load."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from runtime.devices.backends import register, schema_function_ops
from runtime.devices.config import DeviceConfig
from runtime.devices.device import Program
from runtime.devices.manager import DeviceManager
from runtime.devices.ort.options import ArenaDebt, new_session, refuse_empty
from runtime.errors import ProvisionError, first_line
from runtime.onnx_kinds import DEFAULT_DOMAINS
from runtime.types import OutsizedFeeds


class OrtFunction:
    def __init__(self, session: ort.InferenceSession):
        self.session = session
        self.output_names = tuple(o.name for o in session.get_outputs())
        self._names = list(self.output_names)
        self._one = self._names[0] if len(self._names) == 1 else None  # the usual case
        # The binding under InferenceSession.run: its Python wrapper re-checks feeds we
        # have already checked, which costs microseconds a small model notices.
        binding = getattr(session, "_sess", None)
        self._call = binding.run if binding is not None else session.run
        self._arena = ArenaDebt()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outsized, arena = type(feeds) is OutsizedFeeds, self._arena
        outputs = arena.run(self._call, self._names, feeds, outsized) if outsized or \
            arena.lent else self._call(self._names, feeds, None)  # usual: nothing owed
        if self._one is not None:
            return {self._one: outputs[0]}
        return dict(zip(self.output_names, outputs, strict=True))


class CheckedOrtFunction(OrtFunction):
    """An OrtFunction whose model holds an op onnxruntime ends the process on when a feed
    is empty (`refuse_empty`): such a run fails instead, and the host serves on."""

    def __init__(self, session: ort.InferenceSession,
                 check: Callable[[Mapping[str, Any]], None]):
        super().__init__(session)
        self.check = check

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.check(feeds)
        return super().run(feeds)


def ort_function(program: Program, config: DeviceConfig, threads: int) -> OrtFunction:
    try:
        session = new_session(program.model, threads, program.external, program.half,
                              spin=config.spin)
    except Exception as exc:
        raise ProvisionError(f"{config.name}: onnxruntime cannot load {program.name or 'model'}"
                             f" on CPU: {first_line(exc)}") from None
    check = refuse_empty(program.ops)
    return OrtFunction(session) if check is None else CheckedOrtFunction(session, check)


def compile_cpu(program: Program, config: DeviceConfig) -> OrtFunction:
    return ort_function(program, config, config.threads)


def cpu_device(config: DeviceConfig, bus: Any = None) -> DeviceManager:
    return DeviceManager(config, compile_cpu, bus)


def cpu_ops() -> frozenset[str] | None:
    """Op names with a CPU kernel, plus Constant (folded into an initializer at load) and
    onnx function ops up to the newest opset the kernels know (inlined at load)."""
    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import get_all_opkernel_def

        kernels = [k for k in get_all_opkernel_def()
                   if k.provider == "CPUExecutionProvider" and k.domain in DEFAULT_DOMAINS]
    except (ImportError, AttributeError):
        return None
    if not kernels:
        return None
    newest = max(k.version_range[0] for k in kernels)
    return frozenset({k.op_name for k in kernels} | {"Constant"} | schema_function_ops(newest))


def cpu_accepts(node, graph) -> str | None:
    from runtime.devices.ort.kernels import ort_problem

    return ort_problem(node, graph)


register("cpu", cpu_device, cpu_ops, cpu_accepts)
