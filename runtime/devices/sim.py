"""`sim` backend: a modelled accelerator.

Real values come from a 1-thread onnxruntime CPU session. The device keeps its own
timeline: a run starts when it has arrived and the device is free, like a command queue,
and ends the program's modelled time (compute plus its ends of the copies) later; the
device is held until then. So many simulated devices share a small host and still keep
time, and the host's Python bookkeeping between runs does not count as device time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.devices.backends import register
from runtime.devices.config import DeviceConfig
from runtime.devices.cpu import ort_function
from runtime.devices.device import Program
from runtime.devices.manager import DeviceManager, Function
from runtime.devices.timeline import Timeline
from runtime.types import Outputs


class SimDevice(DeviceManager):
    def __init__(self, config: DeviceConfig, bus: Any = None):
        super().__init__(config, lambda program, cfg: ort_function(program, cfg, threads=1),
                         bus)
        self._seconds: dict[str, float] = {}  # key -> modelled seconds of one run
        self._timeline = Timeline()

    def _install(self, key: str, program: Program) -> None:
        super()._install(key, program)
        self._seconds[key] = max(0.0, program.est_seconds)

    def _uninstall(self, key: str) -> None:
        super()._uninstall(key)
        self._seconds.pop(key, None)

    def _invoke(self, key: str, function: Function, feeds: dict[str, np.ndarray],
                arrived: float) -> Outputs:
        outputs = function.run(feeds)
        self._timeline.hold(arrived, self._seconds.get(key, 0.0))
        return outputs


register("sim", SimDevice, lambda: None)
