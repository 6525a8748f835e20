"""A training graph cut into pipeline stages: the partitions of the forward graph's plan
are the stages, and each stage's backward runs on its forward's device.

Every node of the training graph serves one of the model's nodes (the rewrites and the
rules say which), and so belongs to that node's partition; the loss goes with the
prediction. Per stage, three programs for its device:

- forward: the stage's forward nodes. Reads its inputs (data, labels, activations from
  earlier stages) and, resident, its weights and running statistics; gives what later
  stages read, the loss (last stage) and what its backward will read; writes the running
  statistics back.
- backward: the stage's backward nodes, then `acc += gradient` for each of its weights.
  Reads the forward tensors it needs and the gradients later stages send (the loss stage:
  the seed, its micro-batch's share of the batch); gives the gradients earlier stages
  read; writes the accumulators back.
- update: the optimizer over the stage's weights (`optimizers.py`), all resident.

Each program's modelled time (what a `sim` device holds for) comes from the cost model:
its nodes on the device, plus its own end of the copies in and out between stages. The
forward tensors a backward reads stay with the stage between its forward and backward
(on a real accelerator, in its memory), so they cost no copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from runtime.cost import device_seconds, graph_costs, link_seconds, send_seconds
from runtime.devices.config import DeviceConfig
from runtime.devices.device import Program
from runtime.devices.ort.sessions import loadable
from runtime.errors import TrainingError
from runtime.graph import holds_half, load_graph, reads_of
from runtime.partition.memory_plan import device_peak_bytes
from runtime.partition.plan import Plan
from runtime.train.backward import SEED
from runtime.train.emit import Emitter
from runtime.train.forward import LOSS
from runtime.train.loss import LOSS_ORIGIN
from runtime.train.optimizers import LR, Optimizer, accumulator, scalar_dtype
from runtime.train.program import TrainingGraph


@dataclass(frozen=True)
class StageProgram:
    key: str  # what the device loads it as
    program: Program
    feeds: tuple[str, ...]  # inputs the coordinator gives (the rest are resident)
    outputs: tuple[str, ...]  # outputs it returns (written ones stay on the device)

    @property
    def empty(self) -> bool:
        """Nothing to run (a stage without weights has nothing to update)."""
        return not self.program.model


@dataclass(frozen=True)
class Stage:
    index: int
    partition: str
    device: str
    forward: StageProgram
    backward: StageProgram
    update: StageProgram
    weights: tuple[str, ...]  # trained here
    statistics: tuple[str, ...]  # running statistics updated here
    resident: Mapping[str, np.ndarray] = field(compare=False, repr=False)
    keeps: tuple[str, ...] = ()  # forward tensors its backward reads (held per micro-batch)

    def program(self, phase: str) -> StageProgram:
        return {"forward": self.forward, "backward": self.backward,
                "update": self.update}[phase]


@dataclass(frozen=True)
class _Slot:
    name: str
    device: str
    nodes: tuple[str, ...]


def build_stages(tg: TrainingGraph, plan: Plan, optimizer: Optimizer, key: str
                 ) -> list[Stage]:
    """The stages of `plan` over `tg` (built for one micro-batch); device keys start
    with `key`."""
    devices = [p.device for p in plan.partitions]
    if len(set(devices)) < len(devices):
        shared = next(d for d in devices if devices.count(d) > 1)
        raise TrainingError(f"the plan puts two partitions on {shared}; a pipeline stage "
                            f"needs a device of its own")
    configs = {d.name: d for d in plan.devices}
    origins = tg.origins
    stage_of = {n: k for k, p in enumerate(plan.partitions) for n in p.nodes}
    prediction_node = next(n for n in tg.forward.nodes if tg.forward.prediction in n.output)
    stage_of[LOSS_ORIGIN] = stage_of[origins[prediction_node.name]]
    for origin, readers in tg.forward.shared.items():  # a shared weight: its first stage's
        stage_of[origin] = min(stage_of[r] for r in readers)
    forward = [[n for n in tg.forward.nodes if stage_of[origins[n.name]] == k]
               for k in range(len(devices))]
    backward = [[n for n in tg.backward.nodes if stage_of[origins[n.name]] == k]
                for k in range(len(devices))]
    homes = _weight_homes(tg, forward, plan)
    readers_f = _readers(forward)
    readers_b = _readers(backward)
    constants = {c.name for c in tg.forward.constants} | set(tg.forward.weights)
    carried = set(tg.forward.facts.shapes) - constants  # what the coordinator holds
    stages = []
    for k, part in enumerate(plan.partitions):
        config = configs[part.device]
        trained = tuple(w for w in tg.forward.trained if homes.get(w) == k)
        statistics = tuple(s for s in tg.forward.statistics if homes.get(s) == k)
        resident = {w: tg.forward.weights[w] for w in (*trained, *statistics)}
        for w in trained:
            resident.update(optimizer.state(w, tg.forward.weights[w]))
        if trained:
            resident.update(optimizer.step_counter(k, scalar_dtype(tg.forward.weights)))
        fwd = _forward_program(tg, k, forward, readers_f, readers_b, statistics, resident,
                               config, key)
        bwd = _backward_program(tg, k, backward, readers_b, trained, resident, config, key)
        upd = _update_program(tg, k, trained, optimizer, resident, config, key)
        keeps = tuple(t for t in _reads(backward[k]) if t in carried)
        stages.append(Stage(k, part.name, part.device, fwd, bwd, upd, trained, statistics,
                            resident, keeps))
    return stages


def _weight_homes(tg: TrainingGraph, forward: list[list[onnx.NodeProto]], plan: Plan
                  ) -> dict[str, int]:
    """weight -> the one stage that reads it. The forward reads a weight shared by several
    nodes through a copy on its earliest reader's stage (`forward._shared_through_copies`);
    one read from inside a subgraph on another stage is refused. Scalars are constants,
    in every stage that reads them."""
    homes: dict[str, int] = {}
    held = {*tg.forward.trained, *tg.forward.statistics}
    for k, nodes in enumerate(forward):
        for t in _reads(nodes):
            if t not in held:
                continue
            if homes.setdefault(t, k) != k:
                a, b = plan.partitions[homes[t]].name, plan.partitions[k].name
                raise TrainingError(f"weight {t} is read by partitions {a} and {b}; a "
                                    f"weight shared across stages cannot be trained")
    return homes


def _reads(nodes: Iterable[onnx.NodeProto]) -> list[str]:
    return list(dict.fromkeys(i for n in nodes for i in reads_of(n)))


def _writes(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    return {o for n in nodes for o in n.output if o}


def _readers(stages: list[list[onnx.NodeProto]]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for k, nodes in enumerate(stages):
        for t in _reads(nodes):
            out.setdefault(t, set()).add(k)
    return out


def _forward_program(tg: TrainingGraph, k: int, forward: list[list[onnx.NodeProto]],
                     readers_f: dict[str, set[int]], readers_b: dict[str, set[int]],
                     statistics: tuple[str, ...], resident: Mapping[str, np.ndarray],
                     config: DeviceConfig, key: str) -> StageProgram:
    nodes = forward[k]
    made = _writes(nodes)
    sent = [t for t in made if readers_f.get(t, set()) - {k}]
    kept = [t for t in made if t in readers_b]
    loss = [LOSS] if LOSS in made else []
    updates = [(tg.forward.statistics[s], s) for s in statistics]
    outputs = list(dict.fromkeys([*sent, *loss, *kept]))
    if not outputs and not updates:  # its nodes make only outputs the loss never reads
        return _nothing(f"{key}/stage{k}/forward", config)
    model = tg.extract(f"{key}/stage{k}/forward", nodes,
                       [*outputs, *(o for o, _ in updates)], frozen=tg.forward.frozen)
    feeds = _fed(model, resident)
    return _program(f"{key}/stage{k}/forward", model, resident, updates, feeds, outputs,
                    config, received=feeds, sent=sent)


def _backward_program(tg: TrainingGraph, k: int, backward: list[list[onnx.NodeProto]],
                      readers_b: dict[str, set[int]], trained: tuple[str, ...],
                      resident: Mapping[str, np.ndarray], config: DeviceConfig, key: str
                      ) -> StageProgram:
    nodes = backward[k]
    made = _writes(nodes)
    sent = [t for t in made if readers_b.get(t, set()) - {k}]
    e = Emitter(tg.forward.opset, prefix=f"stage{k}")
    updates = []
    for w in trained:
        grad = tg.backward.grads[w]
        if grad is not None:
            updates.append((e.op("Add", [accumulator(w), grad]), accumulator(w)))
    types = {accumulator(w): _info(accumulator(w), tg.forward.weights[w]) for w in trained}
    types.update({out: _info(out, tg.forward.weights[w]) for (out, _), w in zip(
        updates, [w for w in trained if tg.backward.grads[w] is not None], strict=True)})
    name = f"{key}/stage{k}/backward"
    if not nodes and not updates:  # a stage the gradient never reaches: a no-op
        return _nothing(name, config)
    model = tg.extract(name, nodes, [*sent, *(o for o, _ in updates)], extra_nodes=e.nodes,
                       extra_initializers=list(e.initializers.values()), types=types,
                       frozen=tg.forward.frozen)
    feeds = _fed(model, resident)
    forward_tensors = set(tg.forward.facts.shapes)
    return _program(name, model, resident, updates, feeds, sent, config,
                    received=[t for t in feeds if t not in forward_tensors and t != SEED],
                    sent=sent)


def _update_program(tg: TrainingGraph, k: int, trained: tuple[str, ...],
                    optimizer: Optimizer, resident: Mapping[str, np.ndarray],
                    config: DeviceConfig, key: str) -> StageProgram:
    name = f"{key}/stage{k}/update"
    if not trained:
        return _nothing(name, config)
    weights = {w: tg.forward.weights[w] for w in trained}
    e = Emitter(tg.forward.opset, prefix=f"stage{k}/update")
    scalar = scalar_dtype(tg.forward.weights)
    writes = optimizer.write(e, {w: v.dtype for w, v in weights.items()}, k,
                             {w: v.shape for w, v in weights.items()}, scalar)
    made = _writes(e.nodes)
    reads = [t for t in _reads(e.nodes) if t not in made and t not in e.initializers
             and t != LR]
    inputs = [_info(t, resident[t]) for t in reads] + [_info(LR, np.zeros((), scalar))]
    graph = helper.make_graph(e.nodes, name, inputs,
                              [_info(o, resident[target]) for o, target in writes],
                              initializer=list(e.initializers.values()))
    model = loadable(helper.make_model(graph, opset_imports=[helper.make_opsetid(
        "", tg.forward.opset)], ir_version=tg.forward.graph.model.ir_version))
    return _program(name, model, resident, writes, (LR,), (), config, received=[], sent=[])


def _info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                         list(value.shape))


def _fed(model: onnx.ModelProto, resident: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    return tuple(i.name for i in model.graph.input if i.name not in resident)


def _nothing(name: str, config: DeviceConfig) -> StageProgram:
    """A program with no work: it is not loaded, and runs in no time."""
    return StageProgram(name, Program(b"", frozenset(), 0, 0, 0.0, name), (), ())


def _program(name: str, model: onnx.ModelProto, resident: Mapping[str, np.ndarray],
             writes: Sequence[tuple[str, str]], feeds: Sequence[str], outputs: Sequence[str],
             config: DeviceConfig, *, received: Sequence[str], sent: Sequence[str]
             ) -> StageProgram:
    """A stage program as its device loads it, timed by the cost model."""
    graph = load_graph(model, name=name, fold=False)  # timed as the device loads it
    compute = sum(device_seconds(c, config) for c in graph_costs(graph).values())
    copies = sum(link_seconds(graph.tensor_bytes(t), config) for t in received) + \
        sum(send_seconds(graph.tensor_bytes(t), config) for t in sent)
    arena = device_peak_bytes([_Slot(name, config.name, tuple(n.name for n in graph.nodes))],
                              graph, config.name)
    constants = sum(graph.tensor_bytes(t.name) for t in model.graph.initializer)
    program = Program(model.SerializeToString(), frozenset(n.op_type for n in model.graph.node),
                      constants, arena, compute + copies, name,
                      resident=tuple(i.name for i in model.graph.input if i.name in resident),
                      writes=tuple(writes), half=holds_half(model))
    return StageProgram(name, program, tuple(feeds), tuple(outputs))
