"""One training run as `prism train` describes it: its settings, and a `Trainer` that runs
them, on the caller's thread or a thread of its own, and writes the trained model (`-o`)
only when every epoch has run.

    run = TrainingRun(TrainSettings(model="cnn.onnx", data="digits.npz", labels="y",
                                    devices="cpu:2", output="trained.onnx"))
    run.start(); ...; run.stop(); run.close()     # or run.run_here(on_step)

The settings travel to `prism train --web`'s Streamlit process as JSON in its
environment (`app.sources`), which runs the training there.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runtime.devices import parse_devices
from runtime.devices.external import save
from runtime.errors import PrismError, TrainingError
from runtime.observe.events import EventBus
from runtime.train.data import read_training_data
from runtime.train.optimizers import Optimizer
from runtime.train.pipeline import StepReport
from runtime.train.trainer import TrainConfig, Trainer, TrainResult

STOP_WAIT = 30.0  # seconds a stopped run may take to finish its step


@dataclass(frozen=True)
class TrainSettings:
    model: str
    data: str
    labels: str
    devices: str
    output: str | None = None
    loss: str = "cross_entropy"
    optimizer: str = "sgd"
    lr: float = 0.01
    batch_size: int = 32
    micro_batches: int = 1
    epochs: int = 1
    schedule: str = "1f1b"
    seed: int | None = 0

    def config(self) -> TrainConfig:
        return TrainConfig(loss=self.loss, optimizer=Optimizer(self.optimizer, self.lr),
                           batch_size=self.batch_size, micro_batches=self.micro_batches,
                           epochs=self.epochs, schedule=self.schedule, seed=self.seed)

    def check_output(self) -> None:
        """Refuse an output that cannot be written, before anything is trained."""
        if self.output is None:
            return
        out = Path(self.output)
        if out.is_dir():
            raise TrainingError(f"-o {out} is a folder; give a file name")
        if not out.resolve().parent.is_dir():
            raise TrainingError(f"-o {out}: no folder {out.parent}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainSettings:
        return cls(**json.loads(text))


class TrainingRun:
    def __init__(self, settings: TrainSettings, bus: EventBus | None = None) -> None:
        settings.check_output()
        self.settings = settings
        self.bus = bus if bus is not None else EventBus()
        data, labels = read_training_data(settings.data, settings.labels)
        self.trainer = Trainer(settings.model, data, labels, parse_devices(settings.devices),
                               settings.config(), bus=self.bus, name=Path(settings.model).stem,
                               labels_name=settings.labels)
        self.result: TrainResult | None = None
        self.error: Exception | None = None
        self.saved: str | None = None
        self._thread: threading.Thread | None = None

    def run_here(self, on_step: Callable[[int, StepReport], None] | None = None
                 ) -> TrainResult:
        """Train on this thread; the trained model is written when every epoch ran."""
        result = self.trainer.run(on_step)
        self.result = result
        if result.complete and self.settings.output is not None:
            save(self.trainer.trained_model(), self.settings.output)  # past 2 GB too
            self.saved = self.settings.output
        return result

    def start(self) -> None:
        """Train on a thread of its own (a dashboard watches the bus meanwhile)."""
        self._thread = threading.Thread(target=self._background, name="prism-train",
                                        daemon=True)
        self._thread.start()

    def _background(self) -> None:
        try:
            self.run_here()
        except Exception as exc:  # kept for whoever waits; the bus has train.failed
            self.error = exc

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the background run has ended."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    def stop(self) -> None:
        self.trainer.stop()
        if not self.wait(STOP_WAIT):
            raise PrismError(f"the training of {self.trainer.name} did not stop within "
                             f"{STOP_WAIT:.0f} s")

    def close(self) -> None:
        self.stop()
        self.trainer.close()

    def summary(self) -> dict[str, Any]:
        """What `prism train --json` prints: the result's figures (the names checks read)."""
        result = self.result
        if result is None:
            raise TrainingError("the training has no result: it did not run")
        out = result.to_dict()
        out["epochs"] = [{"epoch": e.epoch, "loss": e.loss} for e in result.epochs]
        out.update(model=self.settings.model, output=self.saved)
        return out
