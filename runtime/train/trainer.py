"""Training a model over devices, epoch by epoch: `Trainer`.

    with Trainer("cnn.onnx", data, labels, parse_devices("sim:4"), TrainConfig(
            loss="cross_entropy", optimizer=Optimizer("adam", 1e-3), batch_size=64,
            micro_batches=8, epochs=5, schedule="1f1b"), bus=bus) as trainer:
        result = trainer.run()                 # TrainResult: losses, step times, bubble
        onnx.save(trainer.trained_model(), "trained.onnx")

The model is planned over the devices as the host would plan it for inference (the
partitioner's `balanced` mode, symbolic dimensions bound to the micro-batch), each
partition a pipeline stage (`pipeline.py`). Each epoch shuffles the samples and runs
`rows // batch_size` steps (a last short batch is left out, so every step is the same
shape). Every step publishes `train.*` events on `bus` for the dashboards.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from runtime.devices.backends import open_device
from runtime.devices.config import DeviceConfig
from runtime.devices.device import Device
from runtime.errors import TrainingError
from runtime.graph import Graph, load_graph
from runtime.inputs import array_text
from runtime.partition.planning import PartitionSpec, plan_network
from runtime.stored import with_weights
from runtime.train.loss import LABELS, Loss
from runtime.train.optimizers import Optimizer
from runtime.train.owners import owned
from runtime.train.pipeline import Pipeline, StepReport
from runtime.train.program import TrainingGraph
from runtime.train.schedule import SCHEDULES


@dataclass(frozen=True)
class TrainConfig:
    loss: str = "cross_entropy"
    optimizer: Optimizer = field(default_factory=Optimizer)
    batch_size: int = 32
    micro_batches: int = 1
    epochs: int = 1
    schedule: str = "1f1b"
    partition: PartitionSpec = "balanced"  # a mode, or a user map
    seed: int | None = 0  # the shuffle's

    def __post_init__(self) -> None:
        Loss(self.loss)
        if self.schedule not in SCHEDULES:
            raise TrainingError(f"unknown schedule {self.schedule!r}; choose "
                                f"{' or '.join(SCHEDULES)}")
        for name in ("batch_size", "micro_batches", "epochs"):
            if getattr(self, name) < 1:
                raise TrainingError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.batch_size % self.micro_batches:
            raise TrainingError(f"a batch of {self.batch_size} does not split into "
                                f"{self.micro_batches} equal micro-batches")

    @property
    def micro_size(self) -> int:
        return self.batch_size // self.micro_batches


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    loss: float  # the mean of its steps' batch losses
    seconds: float
    steps: int


@dataclass(frozen=True)
class TrainResult:
    epochs: tuple[EpochResult, ...]
    stages: int
    micro_batches: int
    schedule: str
    step_seconds: float  # measured, median over the steps
    ideal_step_seconds: float  # median of each step's ideal (its op times, no host)
    bubble: float  # median over the steps of the idle share of the stages' devices
    peak_activation_bytes: tuple[int, ...]  # per stage, the most held at once
    devices: tuple[str, ...]  # each stage's
    steps: int
    complete: bool = True  # False: stopped before its last epoch ended

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["epochs"] = [{"epoch": e.epoch, "loss": e.loss, "seconds": e.seconds,
                          "steps": e.steps} for e in self.epochs]
        out["peak_activation_bytes"] = list(self.peak_activation_bytes)
        out["devices"] = list(self.devices)
        return out


class Trainer:
    def __init__(self, model: str | Path | onnx.ModelProto | Graph,
                 data: Mapping[str, np.ndarray], labels: np.ndarray,
                 devices: Sequence[DeviceConfig], config: TrainConfig, *, bus: Any = None,
                 name: str | None = None, labels_name: str = "labels") -> None:
        self.config, self.bus = config, bus
        # trains the model's own weights, each parameter its own (`owners`)
        self.graph = owned(load_graph(model, name=name, fold=False))
        self.name = self.graph.name
        self.data, self.labels = _checked_data(self.graph, data, labels, config, labels_name)
        first = {k: v[:config.micro_size] for k, v in self.data.items()}
        self.tg = TrainingGraph.build(self.graph, first, self.labels[:config.micro_size],
                                      Loss(config.loss), what=labels_name, trained_only=True)
        self.labels = Loss(config.loss).labels(
            self.labels, (len(self.labels), *self.tg.forward.facts.shape(
                self.tg.forward.prediction)[1:]), self.tg.forward.facts.dtype(
                self.tg.forward.prediction), labels_name)
        # the graph as planned: symbolic dimensions bound to the micro-batch
        self.costed = load_graph(self.graph.model, default_dim=config.micro_size,
                                 name=self.name, fold=False)
        self.costed.folded = self.graph.folded  # nodes owning took out, a map may name
        _, self.plan = plan_network(self.costed, list(devices), config.partition)
        used = {p.device for p in self.plan.partitions}
        self.devices: dict[str, Device] = {}
        try:
            for d in devices:
                if d.name in used:
                    self.devices[d.name] = open_device(d, bus)
            self.pipeline = Pipeline(self.tg, self.plan, self.devices, config.optimizer,
                                     config.schedule, config.micro_batches,
                                     key=f"train/{self.name}", publish=self._publish,
                                     network=self.name)
        except BaseException:
            self._close_devices()
            raise
        self.reports: list[StepReport] = []
        self._stop = threading.Event()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _publish(self, kind: str, /, **fields: Any) -> None:
        if self.bus is not None:
            self.bus.publish(kind, **fields)

    def stop(self) -> None:
        """Stop `run` after the step in hand (from any thread)."""
        self._stop.set()

    @property
    def steps_per_epoch(self) -> int:
        return len(self.labels) // self.config.batch_size

    def run(self, on_step: Callable[[int, StepReport], None] | None = None) -> TrainResult:
        """Every epoch (until `stop`); `on_step(epoch, report)` after each step (for
        progress). A failure is published (`train.failed`) and raised."""
        try:
            return self._run(on_step)
        except Exception as exc:
            self._publish("train.failed", network=self.name, error=str(exc))
            raise

    def _run(self, on_step: Callable[[int, StepReport], None] | None) -> TrainResult:
        config = self.config
        rng = np.random.default_rng(config.seed)
        self._publish("train.started", network=self.name, schedule=config.schedule,
                      micro_batches=config.micro_batches, batch_size=config.batch_size,
                      epochs=config.epochs, steps_per_epoch=self.steps_per_epoch,
                      optimizer=config.optimizer.kind, lr=config.optimizer.lr,
                      loss=config.loss, stages=[{"stage": s.index, "partition": s.partition,
                                                 "device": s.device}
                                                for s in self.pipeline.stages])
        epochs = []
        step = 0
        for epoch in range(1, config.epochs + 1):
            began = time.perf_counter()
            order = rng.permutation(len(self.labels))
            losses = []
            for i in range(self.steps_per_epoch):
                if self._stop.is_set():
                    break
                rows = order[i * config.batch_size:(i + 1) * config.batch_size]
                report = self.pipeline.step(self._micro_batches(rows), config.optimizer.lr,
                                            step=step, epoch=epoch)
                self.reports.append(report)
                losses.append(report.loss)
                step += 1
                if on_step is not None:
                    on_step(epoch, report)
            if len(losses) < self.steps_per_epoch:
                break
            result = EpochResult(epoch, float(np.mean(losses)), time.perf_counter() - began,
                                 len(losses))
            epochs.append(result)
            self._publish("train.epoch.finished", network=self.name, epoch=epoch,
                          loss=result.loss, seconds=result.seconds, steps=result.steps)
        out = self.result(epochs)
        self._publish("train.finished", network=self.name, epochs=len(epochs),
                      loss=epochs[-1].loss if epochs else None,
                      step_seconds=out.step_seconds,
                      ideal_step_seconds=out.ideal_step_seconds, bubble=out.bubble)
        return out

    def _micro_batches(self, rows: np.ndarray) -> list[dict[str, np.ndarray]]:
        size = self.config.micro_size
        return [{**{k: v[rows[j:j + size]] for k, v in self.data.items()},
                 LABELS: self.labels[rows[j:j + size]]}
                for j in range(0, len(rows), size)]

    def result(self, epochs: Sequence[EpochResult]) -> TrainResult:
        reports = self.reports
        peaks = [max((r.peak_activation_bytes[k] for r in reports), default=0)
                 for k in range(len(self.pipeline.stages))]
        return TrainResult(
            tuple(epochs), len(self.pipeline.stages), self.config.micro_batches,
            self.config.schedule, _median([r.seconds for r in reports]),
            _median([r.ideal_seconds for r in reports]), _median([r.bubble for r in reports]),
            tuple(peaks), tuple(s.device for s in self.pipeline.stages), len(reports),
            len(epochs) == self.config.epochs)

    def trained_model(self) -> onnx.ModelProto:
        """The model as given, its weights (and running statistics) as trained: a plain
        inference model, each parameter an exporter merged its own again, each it folded
        out of another read through that one (`owners`)."""
        model = with_weights(self.graph.model)
        trained = self.pipeline.weights()
        for t in model.graph.initializer:
            if t.name in trained:
                t.CopyFrom(numpy_helper.from_array(trained[t.name], t.name))
        return model

    def close(self) -> None:
        pipeline = getattr(self, "pipeline", None)
        if pipeline is not None:
            pipeline.close()
        self._close_devices()

    def _close_devices(self) -> None:
        for device in self.devices.values():
            device.close()
        self.devices = {}


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _checked_data(graph: Graph, data: Mapping[str, np.ndarray], labels: np.ndarray,
                  config: TrainConfig, labels_name: str
                  ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The model's inputs from `data` as arrays, one row per sample, as many rows as the
    labels, at least a batch of them; one line naming the array otherwise (dtypes and
    shapes are checked against the model when the first batch is)."""
    missing = [i for i in graph.inputs if i not in data]
    if missing:
        raise TrainingError(f"the data has no array {missing[0]!r} for input {missing[0]} "
                            f"of {graph.name}; it has {', '.join(sorted(data)) or 'none'}")
    arrays = {i: np.asarray(data[i]) for i in graph.inputs}
    labels = np.asarray(labels)
    for name, array in (*arrays.items(), (labels_name, labels)):
        if array.ndim == 0:
            raise TrainingError(f"{name} must hold one row per sample, got {array_text(array)}")
        if len(array) != len(labels):
            raise TrainingError(f"{name} has {len(array)} rows but {labels_name} has "
                                f"{len(labels)}; they must match, one per sample")
    if len(labels) < config.batch_size:
        raise TrainingError(f"{len(labels)} samples are fewer than one batch of "
                            f"{config.batch_size}")
    for name, dims in graph.declared_dims(graph.inputs).items():
        rows = dims[0] if dims else None
        if isinstance(rows, int) and rows > 0 and rows != config.micro_size:
            raise TrainingError(
                f"input {name!r} of {graph.name} takes {rows} rows at a time (its first "
                f"dimension is fixed), and a batch of {config.batch_size} in "
                f"{config.micro_batches} micro-batches gives {config.micro_size}: make the "
                f"batch size {rows * config.micro_batches}")
    return arrays, labels
