"""A training run as a dashboard's RuntimeSource: its bus's events (the `train.*` ones
become the view's TrainingView), its plan of stages and its devices. The run trains on a
thread of its own; nothing in it can be changed from a dashboard."""

from __future__ import annotations

import time
from pathlib import Path

from app.dashboard.source import BundleInfo, LoadState, PartitionSteps, ReadOnly, Status
from app.live import EVENTS_KEPT
from app.train_run import TrainingRun
from runtime.devices.device import DeviceStats
from runtime.errors import PrismError
from runtime.observe.events import Event
from runtime.partition import Plan
from runtime.partition.dot import Outline


class TrainingSource(ReadOnly):
    def __init__(self, run: TrainingRun, *, start: bool = True) -> None:
        self.run = run
        self._subscription = run.bus.subscribe(maxlen=EVENTS_KEPT)
        self._outline = Outline.of(run.trainer.costed)
        if start:
            run.start()

    def drain(self) -> list[Event]:
        return self._subscription.drain()

    def now(self) -> float:
        return time.monotonic()

    def state(self) -> Status:
        s = self.run.settings
        return Status(s.model, self.run.trainer.name, self.run.trainer.plan.mode, s.devices,
                      LoadState(), training=True)

    def plan(self) -> Plan:
        return self.run.trainer.plan

    def outline(self) -> Outline:
        return self._outline

    def bundle(self) -> BundleInfo | None:
        return None

    def device_stats(self) -> dict[str, DeviceStats]:
        return {name: d.stats() for name, d in self.run.trainer.devices.items()}

    def partition_steps(self, mode: str) -> PartitionSteps:
        return PartitionSteps.run(self.run.trainer.costed, self.run.settings.devices, mode,
                                  Path(self.run.settings.model).stem)

    def networks(self) -> list[str]:
        return [self.run.trainer.name]

    def _refuse(self, what: str) -> PrismError:
        return PrismError(f"a training run cannot {what}: it trains as started")

    def close(self) -> None:
        self._subscription.close()
        self.run.close()
