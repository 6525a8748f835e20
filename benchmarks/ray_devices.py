"""`ray` devices: what a hop costs, pipelining over actors, and recovery from a kill.

- Per hop, as users call Prism (`host.infer`, one request at a time): host -> actor ->
  host round trip (a one-Relu network on one ray device, less plain onnxruntime running
  it), and ray -> ray (a two-Relu network split over two ray devices, less the same
  network whole on one), for 4 KB, 64 KB and 1 MB tensors.
- Pipelining over 4 ray devices that keep `sim` time (so two cores can host them).
- A killed actor under steady load: time to the first success of a request sent after
  the kill, and that no request was lost or answered twice.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from benchmarks.common import median_seconds, result
from benchmarks.serving import closed_loop
from runtime.devices import parse_devices
from runtime.errors import DeviceLostError, QueueFullError
from runtime.graph import load_graph
from runtime.host import HostManager
from runtime.inputs import input_specs, random_feeds

SIZES = {"4 KB": 4 << 10, "64 KB": 64 << 10, "1 MB": 1 << 20}
PIPELINE = "ray:4:timing=sim:flops=5G:bw=5G:link=10G"
MLP = "sample_models/mlp.onnx"


def relus(width: int, count: int) -> onnx.ModelProto:
    names = ["x", *(f"t{i}" for i in range(1, count)), "y"]
    nodes = [helper.make_node("Relu", [a], [b], name=f"relu{i}")
             for i, (a, b) in enumerate(itertools.pairwise(names))]
    graph = helper.make_graph(
        nodes, "relus", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def hop_figures(repeats: int) -> list[dict]:
    with HostManager(parse_devices("ray:2")) as host:
        return [r for label, size in SIZES.items() for r in _hops(host, label, size, repeats)]


def _hops(host: HostManager, label: str, size: int, repeats: int) -> list[dict]:
    width = size // 4
    x = {"x": np.random.default_rng().standard_normal((1, width)).astype(np.float32)}
    one, two = relus(width, 1), relus(width, 2)
    plain = ort.InferenceSession(one.SerializeToString(), providers=["CPUExecutionProvider"])
    base = median_seconds(lambda: plain.run(None, x), repeats)
    host.add_network("one", one)
    host.add_network("whole", two, partition={"partitions": {"p0": "ray0"},
                                              "nodes": {"relu0": "p0", "relu1": "p0"}})
    host.add_network("split", two, partition={"partitions": {"p0": "ray0", "p1": "ray1"},
                                              "nodes": {"relu0": "p0", "relu1": "p1"}})
    trip, whole, split = (median_seconds(lambda n=name: host.infer(n, x), repeats, warmup=20)
                          for name in ("one", "whole", "split"))
    for name in ("one", "whole", "split"):
        host.remove_network(name)
    return [result(f"ray: host -> actor -> host round trip, {label}", (trip - base) * 1e6,
                   "us", "measured", True, f"one Relu on ray0: {trip * 1e6:.0f} us a request; "
                   f"plain onnxruntime {base * 1e6:.0f} us"),
            result(f"ray: ray -> ray hop, {label}", (split - whole) * 1e6, "us", "measured",
                   True, f"two Relus over ray0, ray1: {split * 1e6:.0f} us; both on ray0: "
                   f"{whole * 1e6:.0f} us ({split / base:.1f}x plain onnxruntime)")]


def pipeline_figure(requests: int) -> dict:
    achieved, _, plan = closed_loop(parse_devices(PIPELINE), "sample_models/cnn.onnx", 32,
                                    requests)
    ideal = 1.0 / plan.bottleneck_seconds
    ratio = achieved / ideal
    return result("ray: 4 ray devices keeping sim time, balanced cnn, 32 in flight: "
                  "throughput / ideal", ratio, "x", ">= 0.85", ratio >= 0.85,
                  f"{achieved:.0f}/s of ideal {ideal:.0f}/s (1 / bottleneck); {PIPELINE}")


def kill_figure(requests: int) -> dict:
    """Steady load from two threads; ray1's actor killed a third of the way in."""
    graph = load_graph(MLP)
    nodes = [n.name for n in graph.nodes]
    with HostManager(parse_devices("ray:2")) as host:
        host.add_network("m", graph, partition={
            "partitions": {"p0": "ray0", "p1": "ray1"},
            "nodes": {n: "p0" if i < len(nodes) // 2 else "p1" for i, n in enumerate(nodes)}})
        sub = host.bus.subscribe(maxlen=500_000, kinds=["request.", "device."])
        x = random_feeds(input_specs(graph), np.random.default_rng())
        sent: list[tuple[float, object]] = []
        ended: dict[object, float] = {}
        kill: list[float] = []
        lock = threading.Lock()

        def client() -> None:
            for _ in range(requests // 2):
                try:
                    future = host.run("m", x, inline=False)
                except QueueFullError:
                    time.sleep(0.05)
                    continue
                future.add_done_callback(lambda f: ended.setdefault(f, time.monotonic()))
                with lock:
                    sent.append((time.monotonic(), future))
                    if len(sent) == requests // 3:
                        kill.append(time.monotonic())
                        os.kill(host.devices["ray1"].info["pid"], signal.SIGKILL)
                time.sleep(0.005)

        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        failed = 0
        for _, future in sent:
            try:
                future.result(60)
            except DeviceLostError:
                failed += 1
        ends = Counter(e.fields["request"] for e in sub.drain()
                       if e.kind in ("request.finished", "request.failed"))
    once = len(ends) == len(sent) and set(ends.values()) == {1}
    first = min(ended[f] for t, f in sent if t > kill[0] and f.exception() is None) - kill[0]
    return result("ray: actor killed under load -> first success after it", first, "s", "< 5",
                  first < 5 and once,
                  f"{len(sent)} requests, {failed} in flight on the lost actor failed naming "
                  f"it, every one ended {'exactly once' if once else 'NOT exactly once'}")


def run(quick: bool = False) -> list[dict]:
    import ray

    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False,
             logging_level=logging.ERROR, log_to_driver=False)
    try:
        repeats = 100 if quick else 400
        return [*hop_figures(repeats),
                pipeline_figure(300 if quick else 2000), kill_figure(200 if quick else 400)]
    finally:
        ray.shutdown()
