"""Measured times: each node's, and each partition's, timed on this machine with
onnxruntime at a device's thread count, the session options and call the devices use.

    timings = measure_nodes(graph, device)          # Timings for the device's kind
    seconds = time_partitions(graph, plan, kinds)   # partition -> its sub-model's run time

Per node: the model order is cut into contiguous chunks (about `CHUNKS`, of even
roofline time); each chunk is extracted as a partition would be, loaded in a session,
fed the values the chunks before it made, and run until `BUDGET` seconds or `MAX_RUNS`
runs have passed (a first run that takes `SLOW` is the time, nothing run again); its
median time, less the fixed cost of a run (timed on a one-node model), is shared among
its nodes in proportion to their roofline times (none to a node computed from weights
alone, which onnxruntime folds as the session loads). A node the device's kind does not
run (a fallback device's) is cut out and keeps the roofline; what it makes is made up at
its bound shape for the chunks after it. A partition then costs that fixed
cost plus the sum of its nodes, and fusions onnxruntime makes inside a chunk are in its
time. `refined` closes the loop on a plan: each partition's own sub-model is timed and
its nodes scaled so they sum to what it measured.

Feeds are the ones given (`sample_feeds`: a model whose values matter, such as ids that
must hold an end token) where they have the shapes bound at load, else drawn for those
shapes: floats from a normal distribution, integers and booleans zero (a valid index into
any table), strings empty. A network with a non-tensor input, or a chunk that fails to
run, is not measured (None): the roofline stays its cost model, and a failed run is logged
(a warning naming the network, the error and the inputs' shapes: a model may take only
some sizes).
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

from runtime.cost import CostModel, Timings, kind_of
from runtime.devices.config import DeviceConfig
from runtime.devices.cpu import OrtFunction
from runtime.devices.external import Held
from runtime.devices.ort.sessions import cpu_session
from runtime.errors import first_line
from runtime.graph import Graph
from runtime.heap import give_back
from runtime.inputs import shapes_text
from runtime.partition.build import build_plan
from runtime.partition.placement import can_run
from runtime.partition.plan import Partition, Plan
from runtime.partition.submodel import held_extract
from runtime.run_sizes import made_up

CHUNKS = 24  # sub-models per measured network
BUDGET = 0.05  # seconds of runs per sub-model (at least MIN_RUNS, unless SLOW)
MIN_RUNS, MAX_RUNS = 5, 200
SLOW = 1.0  # seconds of runs after which a sub-model is run no more
Progress = Callable[[str, int, int], None]  # (what, done, total)
Feeds = Mapping[str, np.ndarray]  # one request's, by input name
log = logging.getLogger(__name__)


def calibration_feeds(graph: Graph, given: Feeds | None = None,
                      seed: int = 0) -> dict[str, np.ndarray] | None:
    """Feeds for the graph's inputs at their bound shapes (a given one that has its input's
    shape and type, else made up), or None if one is not a plain tensor of known type and
    shape."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        info = graph.tensors.get(name)
        if info is None or info.dtype is None or info.shape is None:
            return None
        feed = (given or {}).get(name)
        if not (isinstance(feed, np.ndarray) and feed.shape == tuple(info.shape)
                and feed.dtype == info.dtype):
            feed = made_up(np.dtype(info.dtype), info.shape, rng, 0)
        if feed is None:
            return None
        feeds[name] = feed
    return feeds


def timed_run(function: OrtFunction, feeds: dict[str, np.ndarray]
              ) -> tuple[float, dict[str, np.ndarray]]:
    """(median seconds of a run, the outputs), runs until BUDGET (MIN_RUNS at least, unless
    they pass SLOW) or MAX_RUNS. A first run of SLOW or more is the time: what it spends
    allocating is a sliver of it, and a detection network's run takes seconds."""
    clock = time.perf_counter
    started = clock()
    outputs = function.run(feeds)  # warm: the first run allocates
    first = clock() - started
    if first >= SLOW:
        return first, outputs
    if first < BUDGET:
        function.run(feeds)
    samples: list[float] = []
    started = clock()
    while len(samples) < MAX_RUNS and (clock() - started < BUDGET or (
            len(samples) < MIN_RUNS and clock() - started < SLOW)):
        t = clock()
        function.run(feeds)
        samples.append(clock() - t)
    return statistics.median(samples), outputs


def _function(model: onnx.ModelProto | bytes, device: DeviceConfig, held: Held | None = None
              ) -> OrtFunction:
    """A session of `model` as the device makes its sessions: its threads, its spinning."""
    return OrtFunction(cpu_session(model, device.threads, held.files if held else None,
                                   spin=device.spin))


class _NotLoaded(Exception):
    """A sub-model not extracted or not loaded: whatever the inputs, no run is made."""


def _timed(graph: Graph, part: Partition, device: DeviceConfig, feeds: dict[str, np.ndarray]
           ) -> tuple[float, dict[str, np.ndarray]]:
    """The partition's sub-model timed on `feeds`; its session and weights are gone when
    this returns, for the heap to give back."""
    try:
        model, held = held_extract(graph, part)
        function = _function(model, device, held)
    except Exception as exc:
        raise _NotLoaded(first_line(exc)) from exc
    return timed_run(function, feeds)


def run_overhead(device: DeviceConfig) -> float:
    """The fixed cost of one run: a one-node model's median time."""
    from runtime.devices.hop import probe_program

    seconds, _ = timed_run(_function(probe_program().model, device),
                           {"x": np.zeros((1, 4), np.float32)})
    return seconds


def _unrun(graph: Graph, device: DeviceConfig) -> frozenset[str]:
    """The nodes the device's kind cannot run (a fallback device's, in a heterogeneous
    plan): they are not timed, and what they make is made up for the nodes after them."""
    return frozenset(n.name for n in graph.nodes if not can_run(device, n, graph))


def _chunks(graph: Graph, model: CostModel, device: DeviceConfig, unrun: frozenset[str]
            ) -> list[list[str]]:
    """The model order cut into about CHUNKS runs of even roofline time, and again
    wherever it passes between nodes the device runs and nodes it does not (`unrun`)."""
    names = [n.name for n in graph.nodes]
    times = np.array([model.node_seconds(n, device) for n in names])
    count = min(CHUNKS, len(names))
    edges = np.cumsum(times)
    targets = edges[-1] * np.arange(1, count) / count
    cuts = {0, *np.searchsorted(edges, targets, side="right").tolist(), len(names)}
    cuts.update(i for i in range(1, len(names)) if (names[i] in unrun) != (names[i - 1] in unrun))
    return [names[a:b] for a, b in itertools.pairwise(sorted(cuts)) if b > a]


def _as_partitions(graph: Graph, device: DeviceConfig, groups: Sequence[Sequence[str]]
                   ) -> list[Partition]:
    """Runs of nodes as the partitions a plan on one device would make of them."""
    order = [n.name for n in graph.nodes]
    return build_plan(graph, CostModel.roofline(graph), [device],
                      [(f"c{i}", device.name, list(g)) for i, g in enumerate(groups)],
                      mode="user", order=order).partitions


def _made_up_outputs(graph: Graph, part: Partition) -> dict[str, np.ndarray]:
    """What a partition not run makes, made up at the shapes bound at load."""
    rng = np.random.default_rng(0)
    outputs = {}
    for t in part.outputs:
        info = graph.tensors.get(t)
        value = None if info is None or info.dtype is None or info.shape is None else \
            made_up(np.dtype(info.dtype), info.shape, rng, 0)
        if value is None:
            raise _NotLoaded(f"{t}, made by {part.name}'s nodes it does not run, has no "
                             f"known type and shape to make it up at")
        outputs[t] = value
    return outputs


def _time_in_order(graph: Graph, parts: Sequence[Partition], device: DeviceConfig,
                   feeds: dict[str, np.ndarray], on_progress: Progress | None, what: str,
                   given: Feeds | None, unrun: frozenset[str] = frozenset()
                   ) -> dict[str, float] | None:
    """Each partition's median run time, run in plan order on the values before it made;
    a partition holding a node of `unrun` is not run, nor timed, and its outputs are
    made up. None if one fails to load or run (logged; a run failing on the inputs alone
    as a warning, saying which were made up)."""
    values: dict[str, np.ndarray] = dict(feeds)
    last_read = {t: i for i, p in enumerate(parts) for t in p.inputs}
    seconds: dict[str, float] = {}
    for i, part in enumerate(parts):
        if on_progress is not None:
            on_progress(f"{what} {part.name}", i, len(parts))
        try:
            if unrun.intersection(part.nodes):
                taken, outputs = None, _made_up_outputs(graph, part)
            else:
                taken, outputs = _timed(graph, part, device,
                                        {t: values[t] for t in part.inputs})
        except Exception as exc:  # onnxruntime's errors, an extraction refused: nothing measured
            if isinstance(exc, _NotLoaded) or len(seconds) < i:  # no inputs cause it (a node
                # of another backend, a model its plan's load refuses in one line), or it ran
                # on what a node not run made, made up
                log.info("%s failed, so the roofline stands in for its times: %s", what,
                         first_line(exc))
                return None
            shown = shapes_text({t: v.shape for t, v in feeds.items()}, most=None)
            if all(v is (given or {}).get(t) for t, v in feeds.items()):
                hint = f"on the inputs given, {shown}"
            else:
                hint = (f"on made-up inputs {shown}: the model may take only some sizes or "
                        f"values: give them with --bind DIM=N and --inputs, or bindings and "
                        f"sample_feeds")
            log.warning("%s failed, so the roofline stands in for its times: %s (%s)",
                        what, first_line(exc), hint)
            return None
        finally:
            give_back()  # the session and its copies of the weights, before the next
        if taken is not None:
            seconds[part.name] = taken
        values.update(outputs)
        for t in [t for t, last in last_read.items() if last == i]:
            values.pop(t, None)  # no later partition reads it
    if on_progress is not None:
        on_progress(what, len(parts), len(parts))
    return seconds


def measure_nodes(graph: Graph, device: DeviceConfig, on_progress: Progress | None = None,
                  given: Feeds | None = None) -> Timings | None:
    """Times of every node on the device's kind (onnxruntime at its threads), or None.
    `given`: feeds to time it on (`calibration_feeds`)."""
    feeds = calibration_feeds(graph, given)
    if feeds is None or kind_of(device) is None or not graph.nodes:
        return None
    roofline = CostModel.roofline(graph)
    unrun = _unrun(graph, device)
    parts = _as_partitions(graph, device, _chunks(graph, roofline, device, unrun))
    overhead = run_overhead(device)
    seconds = _time_in_order(graph, parts, device, feeds, on_progress,
                             f"timing {graph.name} on {kind_of(device)}", given, unrun)
    if seconds is None:
        return None
    nodes: dict[str, float] = {}  # a node the device does not run keeps the roofline
    for part in (p for p in parts if p.name in seconds):
        shares = np.array([roofline.node_seconds(n, device) for n in part.nodes])
        kernels = max(seconds[part.name] - overhead, 0.0)
        total = shares.sum()
        nodes.update(zip(part.nodes, (kernels * shares / total if total else shares).tolist(),
                         strict=True))
    return Timings(nodes, overhead, "measured")


def time_partitions(graph: Graph, plan: Plan, on_progress: Progress | None = None,
                    given: Feeds | None = None) -> dict[str, float] | None:
    """Each partition's sub-model's median run time on a session like its device's (for
    partitions on devices of a measured kind; others are left out, and those holding a
    node no such device runs are not run), or None."""
    feeds = calibration_feeds(graph, given)
    timed = [d for d in plan.devices if kind_of(d)]
    if feeds is None or not timed:
        return None
    unrun = _unrun(graph, timed[0])
    kinds = {d.name: kind_of(d) for d in plan.devices}
    measured: dict[str, float] = {}
    for kind, device in {kinds[d.name]: d for d in timed}.items():  # a pass per kind
        seconds = _time_in_order(graph, plan.partitions, device, feeds, on_progress,
                                 f"timing {plan.network}'s partitions", given, unrun)
        if seconds is None:
            return None
        measured.update({p.name: seconds[p.name] for p in plan.partitions
                         if kinds[p.device] == kind and p.name in seconds})
    return measured


def refined(model: CostModel, plan: Plan, measured: Mapping[str, float]) -> CostModel:
    """The model with each measured partition's nodes scaled so that, with its fixed run
    cost, they sum to the partition's measured time (a node in several timed partitions
    of one kind keeps the last scale; a partition is one device's)."""
    timings = {kind: dict(t.nodes) for kind, t in model.timings.items()}
    for part in plan.partitions:
        device = plan.device(part.device)
        kind = kind_of(device)
        if part.name not in measured or kind not in timings:
            continue
        nodes = timings[kind]
        total = sum(nodes.get(n, 0.0) for n in part.nodes)
        want = max(measured[part.name] - model.run_seconds(device), 0.0)
        if total <= 0:
            continue
        scale = want / total
        for n in part.nodes:
            if n in nodes:
                nodes[n] *= scale
    return CostModel(model.costs, {kind: Timings(nodes, model.timings[kind].run_seconds,
                                                 model.timings[kind].source)
                                   for kind, nodes in timings.items()}, model.hops)
