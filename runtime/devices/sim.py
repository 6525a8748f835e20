"""`sim` backend: a modelled accelerator.

Real values come from a 1-thread onnxruntime CPU session. The function reports its
modelled time (compute plus incoming copies) as `modelled_seconds`, and the device's
manager holds the device on the device's own timeline: a run starts when it has
arrived and the device is free, like a command queue, and ends that long after. So
many simulated devices share a small host and still keep time, and the host's Python
bookkeeping between runs does not count as device time.
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
        self.inner, self.modelled_seconds = inner, max(0.0, est_seconds)
        self.output_names = inner.output_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.inner.run(feeds)


def compile_sim(model: onnx.ModelProto, config: DeviceConfig, est_seconds: float) -> SimFunction:
    return SimFunction(ort_function(model, config, threads=1), est_seconds)


register("sim", compile_sim, lambda: None)
