"""A modelled device's clock, shared by `sim` devices and `ray` actors that act as one.

A run starts when it has arrived and the device is free, as on a command queue, and ends
its modelled seconds later; the device is held until then. Imports only the standard
library, so a Ray actor process can keep time without the rest of the runtime.
"""

from __future__ import annotations

import time

SPIN_SECONDS = 2e-4  # time.sleep overshoots by ~50-100 us; spin the tail on perf_counter


def hold_until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        # sleep(0) in the spin releases the GIL, so spinning devices do not starve others
        time.sleep(left - SPIN_SECONDS if left > SPIN_SECONDS else 0)


class Timeline:
    def __init__(self) -> None:
        self.free_at = 0.0  # when the last run ends on the device's timeline (perf_counter)

    def hold(self, arrived: float, seconds: float) -> None:
        """Hold the device until a run that arrived at `arrived` ends, `seconds` after it
        could start. Waking late is the host's lag, not device time: the next run may
        start at the modelled end. Only real compute past it moves the device on."""
        end_at = max(arrived, self.free_at) + seconds
        self.free_at = max(end_at, time.perf_counter())
        hold_until(end_at)
