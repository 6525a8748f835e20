"""A training step pipelined over devices: each stage's programs loaded on its device with
its weights, gradient accumulators and optimizer state resident there (`Device.place`),
and every step run as the schedule orders it.

    pipe = Pipeline(tg, plan, devices, Optimizer("adam", 1e-3), "1f1b", micro_batches=8)
    report = pipe.step(batches, lr=1e-3, step=0)   # one micro-batch's feeds per entry
    pipe.weights(); pipe.close()

Runs go through the devices' own queues (`Device.call`): an op is queued on its stage's
device as soon as what it reads exists and the stage's earlier ops are queued, so stages
run at once, each on its device's worker, and the coordinator only hands tensors on (by
reference) from the callbacks. Weights never come back to the host between steps: the
forward and backward read them where they are, the backward adds into the accumulators
there, the update rewrites both. `weights()` fetches them once, at the end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.devices.device import Device
from runtime.errors import ExecutionError, TrainingError
from runtime.partition.plan import Plan
from runtime.train.backward import SEED
from runtime.train.forward import LOSS
from runtime.train.loss import IGNORED, LABELS
from runtime.train.optimizers import LR, Optimizer, scalar_dtype
from runtime.train.program import TrainingGraph
from runtime.train.schedule import Links, Op, orders, simulate
from runtime.train.stages import Stage, build_stages

Publish = Callable[..., None]  # (kind, **fields)
STEP_TIMEOUT = 600.0  # seconds a step may take before it is given up


@dataclass(frozen=True)
class OpRecord:
    op: Op
    device: str
    start: float  # seconds since the step began
    seconds: float


@dataclass(frozen=True)
class StepReport:
    step: int
    loss: float  # the batch's mean loss
    seconds: float  # measured, first op queued to last op done
    ideal_seconds: float  # the schedule with these op times and no host in between
    bubble: float  # measured share of the stages' device time left idle
    records: tuple[OpRecord, ...]
    peak_activation_bytes: tuple[int, ...]  # per stage: most bytes held for backwards


class Pipeline:
    def __init__(self, tg: TrainingGraph, plan: Plan, devices: Mapping[str, Device],
                 optimizer: Optimizer, schedule: str, micro_batches: int, *,
                 key: str = "train", publish: Publish | None = None,
                 network: str = "model") -> None:
        self.tg, self.plan, self.network = tg, plan, network
        self.micro_batches, self.schedule = micro_batches, schedule
        self.publish = publish
        self.stages = build_stages(tg, plan, optimizer, key)
        self.devices = {s.index: devices[s.device] for s in self.stages}
        self.links = _links(self.stages)
        self.orders = orders(schedule, len(self.stages), micro_batches)
        self.lr_dtype = scalar_dtype(tg.forward.weights)
        self._loaded: list[tuple[Device, str]] = []
        self._placed: list[tuple[Device, list[str]]] = []
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        for stage in self.stages:
            device = self.devices[stage.index]
            device.place(stage.resident)
            self._placed.append((device, list(stage.resident)))
            for phase in ("forward", "backward", "update"):
                sp = stage.program(phase)
                if not sp.empty:
                    device.load(sp.key, sp.program)
                    self._loaded.append((device, sp.key))

    def step(self, batches: Sequence[Mapping[str, np.ndarray]], lr: float, step: int = 0,
             epoch: int = 0, timeout: float = STEP_TIMEOUT) -> StepReport:
        """One step over these micro-batches (each the feeds of the training graph, labels
        included), then each stage's update at `lr`."""
        if len(batches) != self.micro_batches:
            raise TrainingError(f"a step takes {self.micro_batches} micro-batches, "
                                f"got {len(batches)}")
        counted = [self.tg.forward.loss.counted(b[LABELS]) for b in batches]
        if not sum(counted):
            raise TrainingError(f"every label of step {step}'s batch is {IGNORED} "
                                f"(ignored): it has no loss to learn from")
        dtype = self.tg.forward.facts.dtype(LOSS)
        values = [{**b, SEED: np.asarray(c / sum(counted), dtype)} for b, c in zip(
            batches, counted, strict=True)]
        run = _Step(self, values, np.asarray(lr, self.lr_dtype), step, epoch)
        return run.go(timeout)

    def modelled_seconds(self) -> float:
        """The schedule's step with every program taking its modelled time (what a `sim`
        device holds for): the ideal the cost model promises."""
        return simulate(self.orders, self.links, lambda op: self.stages[op.stage].program(
            op.phase).program.est_seconds)

    def kept_bytes(self, stage: int) -> int:
        """What one micro-batch's activations held for stage `stage`'s backward weigh."""
        facts = self.tg.forward.facts
        return sum(facts.dtype(t).itemsize * int(np.prod(facts.shape(t), dtype=np.int64))
                   for t in self.stages[stage].keeps)

    def weights(self) -> dict[str, np.ndarray]:
        """The trained weights and running statistics, fetched from their devices."""
        out: dict[str, np.ndarray] = {}
        for stage in self.stages:
            out.update(self.devices[stage.index].fetch([*stage.weights, *stage.statistics]))
        return out

    def close(self) -> None:
        for device, key in reversed(self._loaded):
            device.unload(key)
        for device, names in reversed(self._placed):
            device.release(names)
        self._loaded, self._placed = [], []


def _links(stages: Sequence[Stage]) -> Links:
    """Who feeds whom; activations flow to later stages and gradients to earlier ones, or
    a step would wait on itself until its timeout: that is refused here, in one line."""
    made_f = {t: s.index for s in stages for t in s.forward.outputs}
    made_b = {t: s.index for s in stages for t in s.backward.outputs}
    for s in stages:
        # a forward's feed made by a later stage, a backward's by an earlier one
        for phase, made, wrong_way in (("forward", made_f, 1), ("backward", made_b, -1)):
            for t in s.program(phase).feeds:
                if t in made and (made[t] - s.index) * wrong_way > 0:
                    raise TrainingError(
                        f"stage {s.index} ({s.partition})'s {phase} reads {t} from stage "
                        f"{made[t]}'s: the stages would wait on each other")
    before = {s.index: frozenset(made_f[t] for t in s.forward.feeds if t in made_f) - {s.index}
              for s in stages}
    after = {s.index: frozenset(made_b[t] for t in s.backward.feeds if t in made_b) - {s.index}
             for s in stages}
    return Links(before, after)


class _Step:
    """One step in flight: which op each stage runs next, the tensors of each micro-batch,
    the records. Callbacks come from the devices' threads; one lock covers it all."""

    def __init__(self, pipe: Pipeline, values: list[dict[str, Any]], lr: np.ndarray,
                 step: int, epoch: int) -> None:
        self.pipe, self.values, self.lr, self.step, self.epoch = pipe, values, lr, step, epoch
        self.lock = threading.RLock()
        self.finished: set[Op] = set()
        self.total = sum(len(o) for o in pipe.orders)
        self.at = [0] * len(pipe.stages)
        self.records: list[OpRecord] = []
        self.free_at: dict[int, float] = {}
        self.held = [0] * len(pipe.stages)
        self.holding: dict[tuple[int, int], int] = {}  # (stage, micro-batch) -> bytes
        self.peak = [0] * len(pipe.stages)
        self.loss = 0.0
        self.error: BaseException | None = None
        self.ended = threading.Event()
        self.t0 = 0.0

    def go(self, timeout: float) -> StepReport:
        pipe = self.pipe
        self._publish("train.step.started")
        self.t0 = time.perf_counter()
        with self.lock:
            self._advance()
        if not self.ended.wait(timeout):
            raise TrainingError(f"step {self.step} of {pipe.network} did not finish within "
                                f"{timeout:.0f} s")
        if self.error is not None:
            raise self.error
        seconds = max((r.start + r.seconds for r in self.records), default=0.0)
        durations = {r.op: r.seconds for r in self.records}
        ideal = simulate(pipe.orders, pipe.links, lambda op: durations.get(op, 0.0))
        busy = sum(durations.values())
        stages = len(pipe.stages)
        bubble = 1.0 - busy / (stages * seconds) if seconds > 0 else 0.0
        report = StepReport(self.step, self.loss, seconds, ideal, bubble,
                            tuple(sorted(self.records, key=lambda r: r.start)),
                            tuple(self.peak))
        self._publish("train.step.finished", loss=report.loss, seconds=seconds,
                      ideal_seconds=ideal, bubble=bubble,
                      peak_activation_bytes=list(report.peak_activation_bytes))
        return report

    def _publish(self, kind: str, **fields: Any) -> None:
        if self.pipe.publish is not None:
            self.pipe.publish(kind, network=self.pipe.network, epoch=self.epoch,
                              step=self.step, **fields)

    def _advance(self) -> None:
        """Queue every op whose turn it is and whose inputs exist (under the lock)."""
        pipe = self.pipe
        progressed = True
        while progressed and self.error is None:
            progressed = False
            for k, ops in enumerate(pipe.orders):
                while self.at[k] < len(ops) and self.error is None:
                    op = ops[self.at[k]]
                    if any(n not in self.finished for n in pipe.links.needs(op)):
                        break
                    self.at[k] += 1
                    progressed = True
                    self._issue(op)

    def _issue(self, op: Op) -> None:
        pipe = self.pipe
        stage = pipe.stages[op.stage]
        sp = stage.program(op.phase)
        if sp.empty:
            self._landed(op, time.perf_counter(), {}, None)
            return
        feeds = {LR: self.lr} if op.phase == "update" else \
            {t: self.values[op.micro][t] for t in sp.feeds}
        tag = {"network": pipe.network, "request": self.step,
               "partition": stage.partition}
        queued = time.perf_counter()
        pipe.devices[op.stage].call(sp.key, feeds, tag,
                                    lambda out, err: self._landed(op, queued, out, err))

    def _landed(self, op: Op, queued: float, outputs: Mapping[str, np.ndarray] | None,
                error: ExecutionError | None) -> None:
        end = time.perf_counter()
        with self.lock:
            if self.ended.is_set():
                return
            stage = self.pipe.stages[op.stage]
            if error is not None or outputs is None:
                what = "micro-batch " + str(op.micro) if op.micro >= 0 else "the step"
                self.error = TrainingError(f"stage {op.stage} ({stage.partition}) failed in "
                                           f"the {op.phase} of {what} on {stage.device}: "
                                           f"{error}")
                self.ended.set()
                return
            start = max(queued, self.free_at.get(op.stage, queued))
            self.free_at[op.stage] = end
            record = OpRecord(op, stage.device, start - self.t0, end - start)
            self.records.append(record)
            if op.micro >= 0:
                self.values[op.micro].update(outputs)
                self._count(stage, op)
            self.finished.add(op)
            self._publish("train.stage.finished", stage=op.stage, device=stage.device,
                          phase=op.phase, micro_batch=op.micro, start=record.start,
                          seconds=record.seconds, held_bytes=self.held[op.stage])
            if len(self.finished) == self.total:
                self.ended.set()
                return
            self._advance()

    def _count(self, stage: Stage, op: Op) -> None:
        """Bytes a stage holds for its backwards: from its forward of a micro-batch to its
        backward of it, what that backward will read of the forward's tensors."""
        values = self.values[op.micro]
        if op.phase == "forward":
            if LOSS in values and LOSS in stage.forward.outputs and float(values[SEED]):
                # (a micro-batch whose every label is ignored has a NaN mean and no share)
                self.loss += float(values[LOSS]) * float(values[SEED])
            held = sum(values[t].nbytes for t in stage.keeps if t in values)
            self.holding[stage.index, op.micro] = held
            self.held[stage.index] += held
            self.peak[stage.index] = max(self.peak[stage.index], self.held[stage.index])
        else:
            self.held[stage.index] -= self.holding.pop((stage.index, op.micro), 0)
