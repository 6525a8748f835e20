"""A training run as both dashboards show it, built from its `train.*` events alone (so a
live run and a recorded one look alike): the loss step by step, and per device a timeline
of the latest step's forward and backward micro-batches, where the gaps are the bubble.

    tracker = TrainingTracker()
    tracker.feed(events)             # any events; only train.* ones count
    view = tracker.view()            # a TrainingView, or None before a run starts
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from runtime.observe.events import Event

LOSSES_KEPT = 2000  # step losses the curve keeps (older ones are averaged in pairs)


@dataclass(frozen=True)
class TimelineBar:
    """One run on a device in a step: a micro-batch's forward or backward, or the update;
    `start` in seconds from the step's start."""

    device: str
    stage: int
    phase: str  # forward, backward, update
    micro_batch: int  # -1 for the update
    start: float
    seconds: float

    @property
    def end(self) -> float:
        return self.start + self.seconds

    @property
    def label(self) -> str:
        return "U" if self.micro_batch < 0 else f"{self.phase[0].upper()}{self.micro_batch}"


@dataclass(frozen=True)
class StepFigures:
    step: int
    loss: float
    seconds: float
    ideal_seconds: float
    bubble: float
    peak_activation_bytes: tuple[int, ...]


@dataclass(frozen=True)
class TrainingView:
    network: str
    schedule: str
    micro_batches: int
    devices: tuple[str, ...]  # each stage's, in stage order
    epochs: int
    steps_per_epoch: int
    epoch: int  # the one running (or the last)
    steps_done: int
    losses: tuple[float, ...]  # one per step so far (pairs averaged past LOSSES_KEPT)
    epoch_losses: tuple[tuple[int, float], ...]  # (epoch, mean loss) of finished epochs
    timeline: tuple[TimelineBar, ...]  # the latest finished step's runs
    last: StepFigures | None
    finished: bool
    error: str | None = None

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def progress(self) -> float:
        return self.steps_done / self.steps if self.steps else 0.0


@dataclass
class TrainingTracker:
    """Folds `train.*` events into the present TrainingView."""

    started: Event | None = None
    losses: list[float] = field(default_factory=list)
    epoch_losses: list[tuple[int, float]] = field(default_factory=list)
    current: list[TimelineBar] = field(default_factory=list)  # the step running
    timeline: tuple[TimelineBar, ...] = ()
    last: StepFigures | None = None
    epoch: int = 0
    finished: bool = False
    error: str | None = None

    def feed(self, events: Iterable[Event]) -> None:
        for e in events:
            if not e.kind.startswith("train."):
                continue
            handler = getattr(self, "_" + e.kind.removeprefix("train.").replace(".", "_"),
                              None)
            if handler is not None:
                handler(e)

    def _started(self, e: Event) -> None:
        self.__dict__.update(vars(TrainingTracker(started=e)))  # a new run starts afresh

    def _step_started(self, e: Event) -> None:
        self.current, self.epoch = [], int(e["epoch"])

    def _stage_finished(self, e: Event) -> None:
        self.current.append(TimelineBar(e["device"], int(e["stage"]), e["phase"],
                                        int(e["micro_batch"]), float(e["start"]),
                                        float(e["seconds"])))

    def _step_finished(self, e: Event) -> None:
        self.timeline = tuple(self.current)
        self.last = StepFigures(int(e["step"]), float(e["loss"]), float(e["seconds"]),
                                float(e["ideal_seconds"]), float(e["bubble"]),
                                tuple(int(b) for b in e["peak_activation_bytes"]))
        self.losses.append(float(e["loss"]))
        if len(self.losses) > LOSSES_KEPT:
            self.losses = [(a + b) / 2 for a, b in zip(self.losses[::2], self.losses[1::2],
                                                       strict=False)]

    def _epoch_finished(self, e: Event) -> None:
        self.epoch_losses.append((int(e["epoch"]), float(e["loss"])))

    def _finished(self, e: Event) -> None:
        self.finished = True

    def _failed(self, e: Event) -> None:
        self.finished, self.error = True, str(e["error"])

    def view(self) -> TrainingView | None:
        s = self.started
        if s is None:
            return None
        return TrainingView(
            s["network"], s["schedule"], int(s["micro_batches"]),
            tuple(stage["device"] for stage in s["stages"]), int(s["epochs"]),
            int(s["steps_per_epoch"]), self.epoch,
            self.last.step + 1 if self.last is not None else 0, tuple(self.losses),
            tuple(self.epoch_losses), self.timeline, self.last, self.finished, self.error)
