"""Plans against measurements (`--only plans`): how far plans are from their lower bound,
how close a measured plan's estimates come to the run times under pipelined load (as
loaded, and once it has learnt from serving; from callback-driven clients, and learned
from threads and asyncio tasks as well), what calibration does to throughput next to
onnxruntime with two threads, and whether `replicas="auto"` ever loses to one replica.

Everything is measured in this run, in a cache directory of its own (so the first load
measures, as a new user's would). The machine is shared: throughput figures interleave
their configurations round by round and keep each one's median.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from app.loadgen import LoadGenerator, plain_onnxruntime
from benchmarks.clients import asyncio_rate, threads_rate
from benchmarks.common import result
from benchmarks.exports import legacy_bert, legacy_bert_feeds
from runtime.devices import DeviceConfig, parse_devices
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.observe.metrics import Metrics
from runtime.partition import Plan
from runtime.partition.planning import plan_network
from runtime.user_cache import CACHE_ENV

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ("mlp", "cnn", "transformer", "branchy", "control_flow")
REAL = ROOT / "tests" / "real_models"
CLIENTS = 4  # in flight: enough for two stages to overlap
LEARN_SECONDS = 10.0  # served before a learned plan is measured: several of the learner's looks


@dataclass(frozen=True)
class Network:
    """A model to run, the feeds its requests carry and the shapes they bind."""

    name: str
    model: str | onnx.ModelProto
    feeds: Mapping[str, np.ndarray] | None = None
    bindings: Mapping[str, int] | None = None


def real(name: str) -> Network:
    with np.load(REAL / f"{name}.inputs.npz") as saved:
        feeds = {k: saved[k] for k in saved.files}
    shapes = {"batch": 2, "seq": 8} if name != "resnet" else {"batch": 2}
    return Network(name, str(REAL / f"{name}.onnx"), feeds, shapes)


def sample(name: str) -> Network:
    return Network(name, str(ROOT / "sample_models" / f"{name}.onnx"))


def legacy(layers: int = 4) -> Network:
    model = legacy_bert(layers=layers, hidden=256, heads=4, seq=128)
    return Network(f"legacy-bert-{layers}x256x128", model, legacy_bert_feeds(model))


def cpus(n: int) -> list[DeviceConfig]:
    return [DeviceConfig(name=f"cpu{i}", backend="cpu", memory_bytes=1 << 30)
            for i in range(n)]


@dataclass(frozen=True)
class Run:
    rate: float  # requests per second
    plan: Plan
    p50: dict[str, float]  # partition -> median run time under the load
    load_seconds: float  # add_network, measuring included
    cores: float  # CPU seconds this process used per second of the load: what it was given


def callbacks(host: HostManager, net: Network, requests: int) -> float:
    """`requests` from CLIENTS closed-loop clients, each sending its next request from the
    answer's callback (`LoadGenerator`); requests/s."""
    return LoadGenerator(host, net.name, concurrency=CLIENTS, requests=requests,
                         feeds=net.feeds, bindings=net.bindings).measure()


def threads(host: HostManager, net: Network, requests: int) -> float:
    """The same from CLIENTS threads looping `host.run(...).result()`."""
    feeds = _own_feeds(net)
    return threads_rate(lambda: host.run(net.name, feeds).result(), CLIENTS,
                        requests // CLIENTS)


def coroutines(host: HostManager, net: Network, requests: int) -> float:
    """The same from CLIENTS asyncio tasks awaiting `host.run_async(...)`."""
    feeds = _own_feeds(net)
    return asyncio_rate(lambda: host.run_async(net.name, feeds), CLIENTS, requests // CLIENTS)


def _own_feeds(net: Network) -> Mapping[str, np.ndarray]:
    if net.feeds is None:
        raise ValueError(f"{net.name}: threads and asyncio clients send the network's feeds")
    return net.feeds


Callers = Callable[[HostManager, Network, int], float]
CALLERS: dict[str, Callers] = {"callbacks": callbacks, "threads": threads,
                               "asyncio": coroutines}


def pipelined(net: Network, devices: list[DeviceConfig], requests: int, learned: bool = False,
              callers: Callers = callbacks, **options) -> Run:
    """Prism under `CLIENTS` closed-loop `callers`: its throughput and each partition's
    median run time (the median of its copies' when replicated), with the plan it was
    loaded with, or (`learned`) the plan it has after serving LEARN_SECONDS while it learns
    (runtime/host/learning.py)."""
    with HostManager(devices, max_queue=4 * CLIENTS, max_active=2 * CLIENTS) as host:
        start = time.perf_counter()
        plan = host.add_network(net.name, net.model, bindings=net.bindings, **options)
        loaded = time.perf_counter() - start
        until = time.perf_counter() + (LEARN_SECONDS if learned else 0.0)
        callers(host, net, CLIENTS * 10)  # warm
        while time.perf_counter() < until:  # long enough for the learner to look a few times
            callers(host, net, CLIENTS * 100)
        plan = host.plan(net.name)  # what it predicts for the load measured next
        runs = host.bus.subscribe(maxlen=requests * 4, kinds=("partition.run.finished",))
        cpu, wall = time.process_time(), time.perf_counter()
        rate = callers(host, net, requests)
        cores = (time.process_time() - cpu) / (time.perf_counter() - wall)
        metrics = Metrics(samples=requests)
        metrics.feed(runs.drain())
    stats = metrics.snapshot().partitions.values()  # one entry per copy of a partition
    return Run(rate, plan, {p.name: statistics.median(s.p50 for s in stats if (
        s.network, s.partition) == (net.name, p.name)) for p in plan.partitions}, loaded, cores)


def bound_gaps(quick: bool) -> list[dict]:
    """The plan's bottleneck over its lower bound, sample models on 2..8 cpu devices."""
    counts = (2, 4, 8) if quick else tuple(range(2, 9))
    out = []
    for name in SAMPLES:
        graph = load_graph(ROOT / "sample_models" / f"{name}.onnx", name=name)
        gaps = {n: plan_network(graph, cpus(n))[1].gap for n in counts}
        worst = max(gaps.values())
        out.append(result(f"{name} on 2-8 cpu devices (measured costs): plan over its "
                          f"lower bound", 1 + worst, "x", "reported", True,
                          "; ".join(f"{n}: +{g:.0%}" for n, g in gaps.items())))
    return out


MIXED = "cpu:2,sim:4:mem=2MB:ops=Conv+Gemm+MatMul+Relu+Add"  # accelerators run a few ops


def mixed_gaps(quick: bool) -> list[dict]:
    """The plan's bottleneck over its lower bound on cpus and op-limited accelerators: the
    cpus take what the accelerators cannot run, or what does not fit them."""
    out = []
    for name in SAMPLES:
        graph = load_graph(ROOT / "sample_models" / f"{name}.onnx", name=name)
        plan = plan_network(graph, parse_devices(MIXED))[1]
        used = sorted({p.device for p in plan.partitions})
        out.append(result(f"{name} on {MIXED}: plan over its lower bound", 1 + plan.gap, "x",
                          "reported", True, f"{len(plan.partitions)} partitions on "
                          f"{', '.join(used)}"))
    return out


def estimates(quick: bool) -> list[dict]:
    """On exports the repository never had, over 2 one-thread cpu devices, balanced with
    default settings: each partition's estimate against its median run time under
    pipelined load, the stages' balance, and weights crossing devices per request; with
    the plan as loaded, and as it is after serving a while as it learns."""
    networks = [real("bert"), real("gpt2"), real("resnet"), legacy(2 if quick else 4)]
    out = []
    for net in networks:
        for learned in (False, True):
            run = pipelined(net, cpus(2), 600 if quick else 3000, learned)
            out += _estimate_rows(net, run, "learned" if learned else "as loaded")
    return out


def by_callers(quick: bool) -> list[dict]:
    """The learned plan's estimates and balance as `estimates` measures them, under the
    other ways users call: threads blocking on `host.run(...).result()`, and asyncio
    tasks. What a stage waits for the GIL depends on who runs Python between its runs
    (docs/performance.md, "Three ways of calling")."""
    out = []
    for net in (real("bert"), real("gpt2"), real("resnet")):
        for name in ("threads", "asyncio"):
            run = pipelined(net, cpus(2), 600 if quick else 3000, True, CALLERS[name])
            out += _estimate_rows(net, run, f"learned, {CLIENTS} {name} clients")[:2]
    return out


def _estimate_rows(net: Network, run: Run, which: str) -> list[dict]:
    graph_weights = set(load_graph(net.model, bindings=net.bindings).initializers)
    crossing = [t.tensor for t in run.plan.transfers if t.tensor in graph_weights]
    errors = {p.name: p.est_seconds / run.p50[p.name] - 1 for p in run.plan.partitions}
    worst = max(abs(e) for e in errors.values())
    stages = list(run.p50.values())
    balance = max(stages) / min(stages)
    detail = "; ".join(f"{p.name} ({len(p.nodes)} nodes) est {p.est_seconds * 1e6:.0f} us, "
                       f"p50 {run.p50[p.name] * 1e6:.0f} us ({errors[p.name]:+.0%})"
                       for p in run.plan.partitions)
    head = f"{net.name} on cpu:2, plan {which}"
    return [result(f"{head}: worst estimate off its p50 under load", 100 * worst, "%",
                   "<= 25", worst <= 0.25,
                   f"{detail}; {run.plan.costs} costs; first load {run.load_seconds:.2f} s; "
                   f"the process got {run.cores:.2f} cores"),
            result(f"{head}: slowest stage / fastest (p50)", balance, "x", "<= 1.15",
                   balance <= 1.15, f"{len(stages)} stages, {run.rate:.0f} requests/s"),
            result(f"{head}: weight tensors crossing devices per request", len(crossing), "",
                   "0", not crossing, ", ".join(crossing) or "none")]


def calibration(quick: bool) -> list[dict]:
    """Throughput on 2 cpu devices with the roofline's plan and the measured one, and
    plain onnxruntime with 2 threads, interleaved round by round."""
    rounds = 2 if quick else 5
    requests = 600 if quick else 3000
    out = []
    for name in ("transformer", "cnn"):
        net = sample(name)
        graph = load_graph(net.model)
        rates: dict[str, list[float]] = {"onnxruntime": [], "model": [], "measured": []}
        plans: dict[str, Plan] = {}
        for _ in range(rounds):
            rates["onnxruntime"].append(plain_onnxruntime(graph, CLIENTS, requests, 2)[0])
            for costs in ("model", "measured"):
                run = pipelined(net, cpus(2), requests, costs=costs)
                rates[costs].append(run.rate)
                plans[costs] = run.plan
        median = {k: statistics.median(v) for k, v in rates.items()}
        for costs in ("model", "measured"):
            ratio = median[costs] / median["onnxruntime"]
            shape = "/".join(str(len(p.nodes)) for p in plans[costs].partitions)
            out.append(result(f"{name}, {CLIENTS} in flight: Prism on 2 cpu devices, "
                              f"{'before' if costs == 'model' else 'after'} calibration "
                              f"({costs} costs) / onnxruntime with 2 threads", ratio, "x",
                              "reported", True,
                              f"{median[costs]:.0f}/s vs {median['onnxruntime']:.0f}/s "
                              f"(medians of {rounds} interleaved rounds); nodes per "
                              f"partition {shape}"))
    return out


def replicas_auto(quick: bool) -> list[dict]:
    """`replicas="auto"` (decided on measured costs) against one replica, 2 cpu devices."""
    rounds = 1 if quick else 3
    requests = 500 if quick else 2000
    networks = [*(sample(n) for n in SAMPLES), real("bert"), real("gpt2"), real("resnet")]
    out = []
    for net in networks:
        rates: dict[str, list[float]] = {"1": [], "auto": []}
        layout = ""
        for _ in range(rounds):
            for replicas in ("1", "auto"):
                run = pipelined(net, cpus(2), requests,
                                replicas=1 if replicas == "1" else "auto")
                rates[replicas].append(run.rate)
                if replicas == "auto":
                    layout = f"{len({p.device for p in run.plan.partitions})} device(s) a copy"
        ratio = statistics.median(rates["auto"]) / statistics.median(rates["1"])
        out.append(result(f"{net.name} on cpu:2: replicas=auto / replicas=1 throughput", ratio,
                          "x", ">= 0.95", ratio >= 0.95,
                          f"{statistics.median(rates['auto']):.0f}/s vs "
                          f"{statistics.median(rates['1']):.0f}/s; auto: {layout}"))
    return out


def run(quick: bool = False) -> list[dict]:
    previous = os.environ.get(CACHE_ENV)
    with tempfile.TemporaryDirectory(prefix="prism-bench-cache-") as cache:
        os.environ[CACHE_ENV] = cache  # a first load measures, as a new user's would
        try:
            return [*bound_gaps(quick), *mixed_gaps(quick), *estimates(quick),
                    *by_callers(quick), *calibration(quick), *replicas_auto(quick)]
        finally:
            if previous is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = previous
