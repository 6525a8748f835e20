"""The partitioner: graph + devices -> Plan, as a generator of steps a UI can replay.

    steps = partition_steps(graph, devices, "balanced")
    for step in steps: ...           # each decision, with its reason
    plan = partition(graph, devices, "balanced")   # or run it to the end
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from runtime.cost import CostModel
from runtime.devices.config import DeviceConfig
from runtime.errors import PartitionError
from runtime.graph import Graph
from runtime.inputs import shapes_text
from runtime.partition.balanced import balanced_mode, optimal_split
from runtime.partition.bound import lower_bound
from runtime.partition.build import build_plan
from runtime.partition.canonical import canonical_devices
from runtime.partition.fewest import memory_mode
from runtime.partition.greedy import Split
from runtime.partition.liveness import weight_bytes
from runtime.partition.order import choose_order, model_order
from runtime.partition.pairs import keep_pairs
from runtime.partition.placement import (
    Annotations,
    Placement,
    confined_groups,
    place,
    read_annotations,
)
from runtime.partition.plan import MODES, Plan
from runtime.partition.record import Recorder, Steps, finish, tap
from runtime.partition.regions import placement_order, region_split
from runtime.partition.segments import Segments
from runtime.partition.steps import Step
from runtime.partition.user import read_user_map, user_mode
from runtime.partition.validate import validate_plan
from runtime.units import human_bytes, human_seconds


def placed(graph: Graph, devices: Sequence[DeviceConfig],
           annotations: str | Path | Mapping | Annotations | None = None,
           fallback: str | None = None) -> Placement:
    """The devices each node may run on, or the PartitionError saying why a node has none
    (or the devices are none, or named twice)."""
    if not devices:
        raise PartitionError("no devices given; a plan needs at least one")
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        raise PartitionError(f"device names repeat: {names}")
    return place(graph, devices, read_annotations(annotations, fallback))


def fitted(graph: Graph, devices: Sequence[DeviceConfig],
           annotations: str | Path | Mapping | Annotations | None = None,
           fallback: str | None = None) -> Placement:
    """`placed`, once each node fits a device it may run on and the weights placement
    confines fit their devices; else the PartitionError saying which does not."""
    placement = placed(graph, devices, annotations, fallback)
    _check_fit(Segments(graph, CostModel.roofline(graph), model_order(graph),
                        placement.allowed), devices, placement)
    return placement


def _check_fit(seg: Segments, devices: Sequence[DeviceConfig], placement: Placement) -> None:
    _check_each_node_fits(seg, devices)
    _check_placed_weights(seg.graph, placement, devices)


def _check_each_node_fits(seg: Segments, devices: Sequence[DeviceConfig]) -> None:
    for i, node in enumerate(seg.nodes):
        if any(seg.fits(i, i + 1, d) for d in devices):
            continue
        able = [d for d in devices if seg.runnable(i, i + 1, d)]
        if not able:
            raise PartitionError(f"node {node.name} ({node.op_type}) cannot run on any device "
                                 f"({', '.join(sorted(d.name for d in devices))})")
        largest = max(able, key=lambda d: d.memory_bytes)
        need = human_bytes(seg.memory(i, i + 1))
        raise PartitionError(f"node {node.name} needs {need}; the largest device has "
                             f"{human_bytes(largest.memory_bytes)}{_costed_at(seg.graph)}")


def _costed_at(graph: Graph) -> str:
    """The sizes inputs of free dimensions were costed at (bound, or made up), and how to
    give others: a node's need grows with them."""
    free = [(name, info) for name in graph.inputs if (info := graph.tensors.get(name))
            and info.shape and any(not isinstance(d, int) for d in info.dims or ())]
    if not free:
        return ""
    shown = shapes_text({name: info.shape or () for name, info in free})
    return f" (at {shown}: other sizes with --bind DIM=N, or bindings)"


def _check_placed_weights(graph: Graph, placement: Placement,
                          devices: Sequence[DeviceConfig]) -> None:
    """Nodes placement keeps on some of the devices need those devices to hold their
    weights: say so in bytes before any split is tried."""
    memory = {d.name: d.memory_bytes for d in devices}
    for group, nodes in confined_groups(graph, placement.allowed, memory):
        need, held = weight_bytes(graph, nodes), sum(memory[d] for d in group)
        if need > held:
            ops = ", ".join(sorted({n.op_type for n in nodes}))
            raise PartitionError(
                f"too few devices for {graph.name}: {len(nodes)} nodes ({ops}) may run only on "
                f"{', '.join(sorted(group))}, and their weights need {human_bytes(need)}; "
                f"those devices have {human_bytes(held)}")


Attempt = tuple[list[Step], Split] | PartitionError


def _attempt(run: Callable[[Recorder], Steps[Split]]) -> Attempt:
    """Run a mode to the end on a recorder of its own: (steps, result), or the error."""
    steps: list[Step] = []
    try:
        return steps, finish(tap(run(Recorder()), steps.append))
    except PartitionError as exc:
        return exc


def partition_steps(graph: Graph, devices: Sequence[DeviceConfig], mode: str = "balanced", *,
                    user_map: str | Path | Mapping | None = None,
                    annotations: str | Path | Mapping | Annotations | None = None,
                    fallback: str | None = None, costs: CostModel | None = None
                    ) -> Steps[Plan]:
    """Yield each decision as a Step (placement first); return the validated Plan.
    `costs`: the cost model to plan with (default: the roofline)."""
    if mode not in MODES:
        raise PartitionError(f"unknown partition mode {mode!r}; choose one of {', '.join(MODES)}")
    costs = costs or CostModel.roofline(graph)
    placement = placed(graph, devices, annotations, fallback)
    rec = Recorder()
    for node in graph.nodes:
        yield rec.step("place", f"{node.name} ({node.op_type}): {placement.reasons[node.name]}"
                       f" -> {', '.join(sorted(placement.allowed[node.name]))}",
                       nodes=(node.name,))
    if mode == "user":
        if user_map is None:
            raise PartitionError("partition mode 'user' needs a map: a TOML or JSON file")
        order = model_order(graph)
        yield rec.step("order", "split along the model order (user map)", nodes=tuple(order))
        groups = yield from user_mode(graph, devices, read_user_map(user_map), order, rec)
        plan = build_plan(graph, costs, devices, groups, mode=mode, order=order)
        validate_plan(plan, graph, placement.allowed)
    else:
        pins: dict[str, list[int]] = {}
        for i, node in enumerate(graph.nodes):
            if len(placement.allowed[node.name]) == 1:
                pins.setdefault(next(iter(placement.allowed[node.name])), []).append(i)
        ordered = canonical_devices(devices, {d: tuple(v) for d, v in pins.items()})
        options: list[tuple[list[str], str, Segments, Attempt]] = []
        order, why = choose_order(graph)
        yield rec.step("order", why, nodes=tuple(order))
        seg = Segments(graph, costs, order, placement.allowed)
        _check_fit(seg, ordered, placement)
        run_mode = memory_mode if mode == "memory" else balanced_mode
        options.append((order, why, seg, _attempt(lambda r: run_mode(seg, ordered, r))))
        if isinstance(options[0][3], PartitionError) and mode == "memory":
            # past fewest.MAX_STATES fill keeps the canonical sequence; balanced's may fit
            options.append((order, why, seg, _attempt(lambda r: balanced_mode(seg, ordered, r))))
        if not placement.unconstrained:
            alike = placement_order(graph, placement.allowed)
            regional = Segments(graph, costs, alike, placement.allowed)
            why = "split along an order that keeps nodes placed alike together"
            options.append((alike, why, regional, _attempt(
                lambda r: run_mode(regional, ordered, r))))
            # balanced also weighs memory's choices, so it is never the worse of the two
            for style in ("memory", "stay") if mode == "memory" else ("balanced", "memory",
                                                                      "stay"):
                options.append((alike, why, regional, _attempt(
                    partial(region_split, regional, ordered, style))))
        first = options[0][3]
        done = [(o, w, sg, r) for o, w, sg, r in options if not isinstance(r, PartitionError)]
        if isinstance(first, PartitionError) and not done:
            raise first
        scored, rejected = [], []
        for along, why, sg, (steps, split) in done:
            groups = [(f"p{i}", d.name, sg.order[a:b]) for i, (a, b, d) in enumerate(split)]
            try:
                trial = build_plan(graph, costs, devices, groups, mode=mode, order=along)
                validate_plan(trial, graph, placement.allowed)
            except PartitionError as exc:
                rejected.append(exc)
                continue
            moved = sum(t.bytes for t in trial.transfers)
            key = (len(trial.partitions), moved, trial.bottleneck_seconds) if mode == "memory" \
                else (trial.bottleneck_seconds, len(trial.partitions), moved)
            scored.append((key, along, why, steps, trial, sg))
        if not scored:
            raise first if isinstance(first, PartitionError) else rejected[-1]
        _, chosen, why, steps, plan, chosen_seg = min(scored, key=lambda s: s[0])
        if chosen != order:
            order = chosen
            yield rec.step("order", why, nodes=tuple(order))
        for step in steps:
            yield rec.step(step.kind, step.reason, step.partition, step.device, step.nodes)
        if mode == "balanced":
            yield from _idle(chosen_seg, ordered, plan, rec)
    plan, notes = yield from keep_pairs(graph, costs, devices, plan, placement.allowed, rec,
                                        move=mode != "user")
    reasons = _explained(placement, plan, mode)
    for name, note in notes.items():
        reasons[name] += f"; {note}"
    bound = lower_bound(graph, costs, devices, placement.allowed)
    plan = replace(plan, reasons=reasons, lower_bound_seconds=bound.seconds, costs=costs.name)
    gap = f"{plan.gap:.0%}" if bound.seconds > 0 else "-"
    yield rec.step("bound", f"no split of {graph.name} over {len(devices)} devices beats "
                   f"{human_seconds(bound.seconds)} per request ({bound.why()}); this plan "
                   f"{human_seconds(plan.bottleneck_seconds)}, gap {gap}")
    yield rec.step("planned", f"planned {len(plan.partitions)} partitions; bottleneck "
                   f"{human_seconds(plan.bottleneck_seconds)}, lower bound "
                   f"{human_seconds(bound.seconds)} (gap {gap}; {costs.name} costs)")
    return plan


IDLE_SEARCH = 2.0  # an idle step looks for splits using every device this much slower


def _idle(seg: Segments, devices: Sequence[DeviceConfig], plan: Plan, rec: Recorder
          ) -> Steps[None]:
    """A step per device the balanced plan leaves idle, saying why: what the best split
    that gives every device work would cost, against this plan."""
    used = {p.device for p in plan.partitions}
    idle = [d for d in devices if d.name not in used]
    if not idle:
        return
    names = ", ".join(d.name for d in idle)
    limit = IDLE_SEARCH * plan.bottleneck_seconds
    try:
        every = optimal_split(seg, devices, every=True, limit=limit)
    except PartitionError:
        every = []
    stages = [(seg.seconds(a, b, d), seg.model.fixed_seconds(d), d) for a, b, d in every]
    worst, fixed, where = max(stages, key=lambda s: s[0], default=(math.inf, 0.0, devices[0]))
    if worst > limit:  # none found within it; one found past it need not be the best
        why = (f"no split giving each of the {len(devices)} devices work fits their memory "
               f"with its slowest stage under {human_seconds(limit)} ({IDLE_SEARCH:g}x this "
               f"plan's)")
    else:
        why = (f"using every device the best split's slowest stage is "
               f"{human_seconds(worst)} on {where.name}")
        if fixed > 0:
            why += f" (of it {human_seconds(fixed)} is each run's fixed cost and dispatch)"
        why += (f", not below this plan's {human_seconds(plan.bottleneck_seconds)}: the "
                f"copies and per-run costs another device adds outweigh the work it takes")
    for device in idle:
        yield rec.step("idle", f"{device.name} left idle ({names} unused): {why}",
                       device=device.name)


def _explained(placement: Placement, plan: Plan, mode: str) -> dict[str, str]:
    """Placement's reason per node, with where the mode put the ones it was free to."""
    where = {n: (p.name, p.device) for p in plan.partitions for n in p.nodes}
    out = {}
    for node, why in placement.reasons.items():
        part, dev = where[node]
        out[node] = (f"cheapest: the {mode} split put it in {part} on {dev}" if why == "cheapest"
                     else f"{why}; in {part} on {dev}")
    return out


def partition(graph: Graph, devices: Sequence[DeviceConfig], mode: str = "balanced", *,
              user_map: str | Path | Mapping | None = None,
              annotations: str | Path | Mapping | Annotations | None = None,
              fallback: str | None = None, costs: CostModel | None = None) -> Plan:
    return finish(partition_steps(graph, devices, mode, user_map=user_map,
                                  annotations=annotations, fallback=fallback, costs=costs))
