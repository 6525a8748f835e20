"""`sim` backend: a modelled accelerator.

Real values come from a 1-thread onnxruntime CPU session; the device is then held
until the partition's modelled time (compute plus incoming copies) has passed since
the run started, so many simulated devices can share a small host and still keep time.
"""

from __future__ import annotations

import time

import numpy as np
import onnx

from runtime.devices.backends import register
from runtime.devices.config import DeviceConfig
from runtime.devices.cpu import OrtFunction, ort_function

SPIN_SECONDS = 2e-4  # time.sleep overshoots by ~50-100 us; spin the tail on perf_counter


def hold_until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        # sleep(0) in the spin releases the GIL, so spinning devices do not starve others
        time.sleep(left - SPIN_SECONDS if left > SPIN_SECONDS else 0)


class SimFunction:
    def __init__(self, inner: OrtFunction, est_seconds: float):
        self.inner, self.est_seconds = inner, max(0.0, est_seconds)
        self.output_names = inner.output_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        out = self.inner.run(feeds)
        hold_until(start + self.est_seconds)
        return out


def compile_sim(model: onnx.ModelProto, config: DeviceConfig, est_seconds: float) -> SimFunction:
    return SimFunction(ort_function(model, config, threads=1), est_seconds)


register("sim", compile_sim, lambda: None)
